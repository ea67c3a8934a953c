"""What the GPU examples need to run, for their command lines (imported as a sibling module
when an example runs as a script)."""


def missing():
    """What is missing here for an example that runs on a CUDA GPU with PyTorch and CuPy,
    as one line, or None."""
    import importlib.util  # noqa: PLC0415

    for name in ("torch", "cupy"):
        if importlib.util.find_spec(name) is None:
            return f"needs {name} (this example runs on a CUDA GPU)"
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        return "needs a CUDA GPU that PyTorch can use"
    from indexer import arrays  # noqa: PLC0415

    if not arrays.gpu_supported():  # (the kernels' own test: CuPy working, sm_80 or newer)
        return "needs a CUDA GPU of compute capability 8.0 or newer, with CuPy"
    return None

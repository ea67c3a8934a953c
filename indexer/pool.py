"""Placeholder: the paged key pool is being written."""


class KeyPool:  # pragma: no cover
    pass

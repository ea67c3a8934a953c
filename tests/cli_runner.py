"""click's CliRunner with stdout and stderr captured apart, on every click the package takes
(8.0 and later): before 8.2 that is ``mix_stderr=False``, which 8.2 removed (always apart)."""

from click.testing import CliRunner


def separate_runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click 8.2+: stderr is always captured apart
        return CliRunner()

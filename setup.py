"""Build hook only (metadata lives in pyproject.toml): ship ``xdpx-aiooss2-fix.pth``.

The ``.pth`` line runs ``xdpx.aiooss2_fix.install()`` at interpreter start so that a plain
``dvc push`` to an ``oss://`` remote works in any environment where xdpx is installed (aiooss2
issue #96; see xdpx/aiooss2_fix.py for why a ``.pth`` file and what it patches). It lands at the
root of the wheel (site-packages) for ``pip install .`` and in the editable wheel for
``pip install -e .``; tests/test_aiooss2_fix.py builds both wheels and checks.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_NAME = "xdpx-aiooss2-fix.pth"  # sorts after __editable__.*.pth, so xdpx is importable
PTH_LINE = "import xdpx.aiooss2_fix; xdpx.aiooss2_fix.install()\n"


class BuildPyWithPth(build_py):
    """build_py that also writes the .pth file at the root of build_lib (-> site-packages)."""

    def run(self):
        super().run()
        if not self.editable_mode:
            Path(self.build_lib, PTH_NAME).write_text(PTH_LINE)


class EditableWheelWithPth(editable_wheel):
    """editable_wheel whose wheel also carries the .pth file (build_lib is not shipped there)."""

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        Path(unpacked_wheel, PTH_NAME).write_text(PTH_LINE)
        return result


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})

"""Build hook only (metadata lives in pyproject.toml): ship ``xdpx-patches.pth``.

The ``.pth`` line runs ``xdpx.patches.install()`` at interpreter start so that a plain
``dvc push`` to an ``oss://`` remote works in any environment where xdpx is installed (aiooss2
issue #96, ossfs without retries; see xdpx/patches/__init__.py for why a ``.pth`` file). It
lands at the root of the wheel (site-packages) for ``pip install .`` and in the editable wheel
for ``pip install -e .``; tests/test_patches.py builds both wheels and checks.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_NAME = "xdpx-patches.pth"  # sorts after __editable__.*.pth, so xdpx is importable
PTH_LINE = "import xdpx.patches; xdpx.patches.install(forget=True)\n"


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

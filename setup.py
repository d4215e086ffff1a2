"""Packaging for SEED RL for PyTorch.

Layout: seed/ installs as `seed`, while agents/ and envs/ (at the repository root) install as `seed.agents` and
`seed.envs`. Packages are found automatically under each of the three roots, so a new subpackage (like
seed.agents.r2d2 or seed.bench) is always in the wheel; tests/test_wheel.py builds one and checks that every
module of the source tree is in it. Data files ship as package data (PACKAGE_DATA).

The gRPC stubs are generated from protos/seed.proto at build/install time with the installed grpcio-tools
(`python setup.py build_py`, `pip install .` and `pip install -e .` all run it); they are never committed.
"""

import os
import shutil
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


def generate_stubs() -> None:
    """Writes seed/_proto/seed_pb2.py and seed_pb2_grpc.py (importable as seed._proto.*)."""
    out_dir = os.path.join(ROOT, "seed", "_proto")
    os.makedirs(out_dir, exist_ok=True)
    open(os.path.join(out_dir, "__init__.py"), "a").close()
    # Mapping the virtual path seed/_proto onto protos/ makes the generated imports package-qualified.
    subprocess.check_call(
        [sys.executable, "-m", "grpc_tools.protoc", f"-Iseed/_proto={os.path.join(ROOT, 'protos')}",
         f"--python_out={ROOT}", f"--grpc_python_out={ROOT}", "seed/_proto/seed.proto"],
        cwd=ROOT,
    )


class BuildPyWithStubs(build_py):
    """Generates the stubs, then copies the packages into a fresh build/lib/seed: a stale copy of a module that
    was moved or deleted in the sources (build/ survives between `pip install .` runs) must not reach the wheel."""

    def run(self):
        generate_stubs()
        shutil.rmtree(os.path.join(self.build_lib, "seed"), ignore_errors=True)
        super().run()


# Import package -> source directory. Every package below a root is found by find_packages.
PACKAGE_ROOTS = {"seed": "seed", "seed.agents": "agents", "seed.envs": "envs"}
# Non-Python files read at run time (through importlib.resources, never through a path into the source tree).
PACKAGE_DATA = {"seed.envs": ["atari57_scores.csv"], "seed.bench": ["*.yaml"]}


def find_all_packages() -> list[str]:
    """Every package under every root of PACKAGE_ROOTS, named as installed (e.g. agents/r2d2 -> seed.agents.r2d2)."""
    packages = []
    for name, directory in PACKAGE_ROOTS.items():
        packages.append(name)
        packages.extend(f"{name}.{sub}" for sub in find_packages(os.path.join(ROOT, directory)))
    return sorted(packages)


# Metadata and editable installs need the seed._proto package to exist before build_py runs.
generate_stubs()
GRPC = "1.85.1"
setup(
    name="seed-rl-torch",
    version="0.1.0",
    description="Scalable RL with central inference (SEED RL) in PyTorch: V-trace and R2D2",
    python_requires=">=3.10",
    packages=find_all_packages(),
    package_dir=PACKAGE_ROOTS,
    package_data=PACKAGE_DATA,
    cmdclass={"build_py": BuildPyWithStubs},
    install_requires=[
        "torch>=2.1",
        f"grpcio=={GRPC}",
        f"grpcio-tools=={GRPC}",
        f"grpcio-health-checking=={GRPC}",
        "protobuf>=7.35.1,<8",
        "numpy",
        "gymnasium>=1.0",
        "absl-py",
        "tensorboard",
        "matplotlib",
        "pyyaml",  # seed-bench configurations and seed-report price tables
        "psutil",  # MemAvailable for the R2D2 replay size check (seed/experience/replay.py)
        "lz4",  # --compression=lz4 of remote actors (seed/transport/compression.py, imported by every actor)
        "numba",  # the compiled MuZero search on the CPU (agents/muzero/search/compiled_*.py)
    ],
    extras_require={
        "atari": ["ale-py>=0.12", "opencv-python-headless"],
        "football": ["gym==0.25.2", "six"],
        # --env=minatar:*; minatar also pulls pandas, scipy and seaborn (its display code, never imported here).
        "minatar": ["minatar"],
        # --env=gym:Hopper-v5 and the other MuJoCo tasks: gymnasium's MuJoCo dependencies (mujoco 4.0 with gymnasium
        # 1.4; headless rendering for seed-eval's videos with MUJOCO_GL=egl).
        "mujoco": ["gymnasium[mujoco]"],
        # seed-eval --video: imageio writes the frames, imageio-ffmpeg ships an ffmpeg binary for MP4, pygame
        # draws gymnasium's classic-control screens (CartPole's rgb_array render).
        "video": ["imageio", "imageio-ffmpeg", "pygame"],
        "wandb": ["wandb"],  # --wandb_project: the Weights & Biases metrics sink (seed/metrics/wandb_sink.py)
        # launch/ray/launcher.py: Ray places the learner and the actors (ray[default]: `ray start`, the dashboard
        # and `ray job submit`; about 240 MB installed). Never imported by seed/.
        "ray": ["ray[default]>=2.60,<2.61"],
        "test": ["pytest", "pytest-xdist>=3.6", "ruff", "pyyaml", "kubernetes-validate==1.37.0", "cryptography"],
    },
    entry_points={
        "console_scripts": [
            "seed-learner=seed.learner.main:run",
            "seed-actor=seed.actor.main:run",
            "seed-bench=seed.bench.cli:run",
            "seed-report=seed.bench.report:run",
            "seed-eval=seed.evaluate:run",
        ]
    },
)

"""Packaging for SEED RL for PyTorch.

The gRPC stubs are generated from protos/seed.proto at build/install time with the installed grpcio-tools
(`python setup.py build_py`, `pip install .` and `pip install -e .` all run it); they are never committed.
"""

import os
import subprocess
import sys

from setuptools import setup
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
    def run(self):
        generate_stubs()
        super().run()


# Metadata and editable installs need the seed._proto package to exist before build_py runs.
generate_stubs()
GRPC = "1.85.1"
setup(
    name="seed-rl-torch",
    version="0.1.0",
    description="Scalable RL with central inference (SEED RL) in PyTorch: V-trace and R2D2",
    python_requires=">=3.10",
    packages=["seed", "seed._proto", "seed.agents", "seed.agents.vtrace", "seed.envs"],
    package_dir={"seed": "seed", "seed.agents": "agents", "seed.envs": "envs"},
    package_data={"seed.envs": ["atari57_scores.csv"]},
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
    ],
    extras_require={
        "atari": ["ale-py>=0.12", "opencv-python-headless"],
        "football": ["gym==0.25.2", "six", "psutil"],
        "test": ["pytest", "ruff", "pyyaml", "kubernetes-validate==1.37.0", "cryptography"],
    },
    entry_points={
        "console_scripts": [
            "seed-learner=seed.learner_main:run",
            "seed-actor=seed.actor_main:run",
            "seed-bench=seed.bench:run",
            "seed-report=seed.report:run",
        ]
    },
)

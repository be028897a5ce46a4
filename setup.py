"""Packaging for tb_gpuprof. Tool configuration lives in pyproject.toml."""

from setuptools import find_packages, setup

TEST_REQUIRES = [
    "pytest>=8",
    "ruff>=0.6",
    "mypy>=1.10",  # .ci/run type-checks the package (config in pyproject.toml)
    "jsonschema>=4.0",  # tests/test_schema.py checks real reports against `tb-gpuprof schema`
    # Real training loops in CI run on the CPU build of torch that this machine kind ships.
    "torch==2.13.0",
    "tensorflow-cpu>=2.16",
    "keras>=3.3",
    "playwright>=1.45",
    "lightning>=2.0",  # the Lightning callback's test runs a real Trainer on CPU
    "jax>=0.4.30",  # Keras-on-JAX and jax.profiler XPlane tests (CPU build)
    "transformers>=4.40",  # the Trainer callback's test runs a real Trainer on CPU
    "accelerate>=0.26",  # the Trainer's own dependency, and the Accelerate-loop test
    "dask[distributed]>=2024.1",  # `report DIR --dask` against a real LocalCluster
]

setup(
    name="tb_gpuprof",
    version="0.1.0",
    description="Why is my training slow on NVIDIA GPUs, and what should I change? "
    "A profiler library and TensorBoard plugin.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.14",
    packages=find_packages(include=["tb_gpuprof", "tb_gpuprof.*"]),
    package_data={"tb_gpuprof": ["static/*", "samples/*", "samples/**/*"]},
    include_package_data=True,
    install_requires=[
        "msgspec>=0.18",  # fast, typed JSON decoding of multi-hundred-MB Kineto traces
        "tensorboard>=2.14",  # the plugin host; also its event-file protos for our writer
        "nvidia-ml-py>=12.535",  # NVML (NVIDIA's own binding, not the deprecated pynvml)
        # XPlane through its C decoder (upb, default since 4.21); tensorboard requires it too
        "protobuf>=4.21",
        # the event files' CRC32C in C (TensorBoard's is pure Python: store/records.py)
        "google-crc32c>=1.5",
    ],
    extras_require={
        "torch": ["torch>=2.1"],
        # The main job (`tb-gpuprof demo`) trains a live run; torch up to the newest release the
        # tests ran on (2.13), which on this project's machines is a local CPU build.
        "demo": ["torch>=2.1,<2.14"],
        "keras": ["keras>=3.0"],
        "transformers": ["torch>=2.1", "transformers>=4.40", "accelerate>=0.26"],
        # `tb-gpuprof report DIR --dask ADDRESS`: rank traces analysed on a Dask cluster
        "dask": ["dask[distributed]>=2024.1"],
        "test": TEST_REQUIRES,
        # benchmarks run torch-tb-profiler (Kineto; it pulls in pandas) and XProf (XPlane) side
        # by side; only the benchmarks use them, never the package.
        "benchmarks": ["torch-tb-profiler==0.4.3", "xprof>=2.20"],
    },
    entry_points={
        "console_scripts": ["tb-gpuprof=tb_gpuprof.cli:main"],
        "tensorboard_plugins": ["gpuprof=tb_gpuprof.plugin.loader:GpuProfPluginLoader"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Environment :: GPU :: NVIDIA CUDA",
        "Framework :: TensorBoard",
    ],
)

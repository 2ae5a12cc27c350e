from setuptools import setup

setup(
    name="asyncrl",
    version="0.1.0",
    description="Single-machine, high-throughput asynchronous APPO (V-trace + PPO clipping)",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    # The top-level envs/ folder is installed as asyncrl.envs (the bare name `envs` is taken on PyPI).
    packages=["asyncrl", "asyncrl.envs"],
    package_dir={"asyncrl": "asyncrl", "asyncrl.envs": "envs"},
    install_requires=[
        "torch>=2.1",
        "numpy>=1.23",
        "gymnasium>=1.0",
        "faster-fifo>=1.4.5",
        "psutil>=5.9",
        "tensorboardX>=2.6",
        "tqdm>=4.60",
        "pyyaml>=5.4",
    ],
    entry_points={"console_scripts": ["asyncrl=asyncrl.cli:main"]},
    extras_require={
        "atari": ["ale-py>=0.9", "opencv-python-headless>=4.5"],
        "bench": ["matplotlib>=3.5", "supersuit>=3.9"],  # supersuit: SB3 on PettingZoo envs
        "doom": ["vizdoom>=1.2", "opencv-python-headless>=4.5"],  # Vizdoom* ids (envs/doom.py)
        "multiagent": ["pettingzoo>=1.24", "mpe2>=1.0"],  # ParallelEnvs; MPE2 in benchmarks/
        "mujoco": ["gymnasium[mujoco]>=1.0"],  # HalfCheetah-v5 etc. (benchmarks/continuous_control.py)
        "box2d": ["gymnasium[box2d]>=1.0"],  # LunarLanderContinuous-v3 (benchmarks/learning_suite.py)
        "sb3": ["stable-baselines3>=2.3"],  # get_env(), SB3 callbacks in learn()
        "ray": ["ray>=2.9"],                # asyncrl.pbt on a Ray cluster
        # model.export / asyncrl export to ONNX (TorchScript needs nothing more)
        "export": ["onnx>=1.16", "onnxscript>=0.3", "onnxruntime>=1.17"],
        "notebook": ["ipykernel>=6.0", "ipywidgets>=8.0"],  # tqdm.auto's bar as a widget
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.25"],  # mkdocs serve
        # asyncrl enjoy --save_video (pygame renders gymnasium's classic-control envs)
        "video": ["imageio>=2.20", "imageio-ffmpeg>=0.4", "pygame>=2.1"],
        "tests": ["pytest>=7", "pytest-timeout>=2.1", "ale-py>=0.9", "opencv-python-headless>=4.5",
                  "stable-baselines3>=2.3", "ray>=2.9", "matplotlib>=3.5", "imageio>=2.20",
                  "imageio-ffmpeg>=0.4", "pygame>=2.1", "hypothesis>=6", "vizdoom>=1.2",
                  "pettingzoo>=1.24", "supersuit>=3.9", "onnx>=1.16", "onnxscript>=0.3",
                  "onnxruntime>=1.17", "nbclient>=0.7", "nbformat>=5.7", "ipykernel>=6.0",
                  "mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.25"],
    },
)

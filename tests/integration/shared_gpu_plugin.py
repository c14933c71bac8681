"""Test plug-in (``--experimental.custom_import shared_gpu_plugin``): ranks as if they shared one GPU.

On CPU the shared-GPU adaptation never applies (no CUDA device). This marks the process as one of
four ranks sharing ``cuda:0`` before TorchTitan builds the pipeline, so the pipeline gets the data
plane it gets there (every link over the delegated path; ``default`` with injected delays under the
link emulator above it) and trains on CPU tensors for real. What the GPU adds beyond that
(``LOCAL_RANK``, Gloo as CUDA's default backend, host copies for the stage's object lists) is
checked on fakes in ``test_shared_gpu.py``.
"""

from titan_morph.integration import cpu

cpu._shared = cpu.SharedGPU(ranks=4, devices=1, index=0)

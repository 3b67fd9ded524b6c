"""The Triton kernels, one file per operator of :mod:`..ops` under the operator's name, and :mod:`.common`, what
several share. Imported only where Triton runs (on CUDA; the tests run them on a CPU with ``TRITON_INTERPRET=1``):
this ``__init__`` imports nothing, so the plugin loads without Triton."""

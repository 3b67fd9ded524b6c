"""The operators under the methods: each file an eager reference and, where a method runs it fused, one
``torch.library`` operator each way (``capsagg::{file name}``), whose Triton kernels are its namesake in
:mod:`..kernels`; :mod:`.dispatch` picks the implementation and finds the kernels."""

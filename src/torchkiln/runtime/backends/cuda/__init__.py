"""The CUDA backend: engines whose pointwise layers run as generated Triton kernels."""

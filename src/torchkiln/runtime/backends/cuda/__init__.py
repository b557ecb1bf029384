"""The CUDA backend: a planner (fused library calls, generated pointwise kernels, tactic timing) and a runner
that replays each input shape's launches as one CUDA graph."""

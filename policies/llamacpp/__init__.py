"""llama.cpp's MoE offloading: `--cpu-moe`, `--n-cpu-moe N`, `-ot` overrides, op offload of large batches, and the GPU expert hot-cache of its pull requests."""

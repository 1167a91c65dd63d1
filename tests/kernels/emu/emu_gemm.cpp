/* The CUDA kernels of kernels/cuda/gemm.cu, compiled for the host emulation. */
#include "gemm.cu"

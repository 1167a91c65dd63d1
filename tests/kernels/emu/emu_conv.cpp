/* The CUDA kernels of kernels/cuda/conv.cu, compiled for the host emulation. */
#include "conv.cu"

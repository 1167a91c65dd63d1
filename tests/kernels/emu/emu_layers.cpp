/* The CUDA kernels of kernels/cuda/layers.cu, compiled for the host emulation. */
#include "layers.cu"

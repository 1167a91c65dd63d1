/* The emulation's stand-in for <cuda_runtime.h>. */
#include "cuda_emu.h"

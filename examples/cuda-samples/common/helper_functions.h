/* helper_functions.h for softuvm: the CUDA samples' helper_functions.h
 * (its strings and timers) are in helper_cuda.h here. */
#include "helper_cuda.h"

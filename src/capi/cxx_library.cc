// libpdkv_cxx.so is pdkv's C++ API as a shared library: its code is the
// static libraries it links whole; this file only gives the target a source.
#include "pdkv/engine.h"

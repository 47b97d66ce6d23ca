// Being written: see rlsched/scheduler/simulator.h.
#include "rlsched/scheduler/simulator.h"

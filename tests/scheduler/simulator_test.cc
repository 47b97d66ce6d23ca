#include "rlsched/scheduler/simulator.h"

// Kept so that `#include "gate_runner.hpp"` resolves: the gate runner is kvgate_harness/gate_runner.hpp.
#pragma once
#include "kvgate_harness/gate_runner.hpp"

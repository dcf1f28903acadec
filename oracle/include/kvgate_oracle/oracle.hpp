// kvgate oracle: an independent FP32/FP64 reference written from docs/FORMATS.md only. It never
// includes or links runtime/ (the top-level CMake asserts it; docs/ARCHITECTURE.md).
#pragma once
#include "kvgate_oracle/attention.hpp"
#include "kvgate_oracle/formats.hpp"
#include "kvgate_oracle/metrics.hpp"
#include "kvgate_oracle/model.hpp"
#include "kvgate_oracle/scalar.hpp"

// One include for Catch2 2.13 (Debian 12) and Catch2 3 (Ubuntu 24.04 / Debian 13).
#pragma once
#if KVGATE_CATCH2_MAJOR == 3
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

// One include for Catch2 2.13 (Debian 12) and Catch2 3 (Ubuntu 24.04 / Debian 13).
#pragma once
#include <string>
#if KVGATE_CATCH2_MAJOR == 3
#include <catch2/catch_all.hpp>
namespace kvgate_catch {
inline auto contains(const std::string& s) { return Catch::Matchers::ContainsSubstring(s); }
}  // namespace kvgate_catch
#else
#include <catch2/catch.hpp>
namespace kvgate_catch {
inline auto contains(const std::string& s) { return Catch::Matchers::Contains(s); }
}  // namespace kvgate_catch
#endif

// Printable ASCII for a gate's report: every byte outside 0x20..0x7E (and the backslash) as \xHH.
// Catch2 2.x's console wrapper can loop on raw tabs / UTF-8, and tokenizer texts are full of both.
#pragma once
#include <cstdio>
#include <string>

namespace kvgate::gates {

inline std::string printable(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      o.push_back(static_cast<char>(c));
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02X", c);
      o += b;
    }
  }
  return o;
}

}  // namespace kvgate::gates

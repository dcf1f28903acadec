#include "kvgate_harness/catch_xml.hpp"

#include <algorithm>
#include <cstdlib>

namespace kvgate::harness {

namespace {

std::string xml_unescape(std::string_view s) {
  std::string r;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      r += s[i];
      continue;
    }
    const std::size_t semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      r += s[i];
      continue;
    }
    const std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") r += '&';
    else if (ent == "lt") r += '<';
    else if (ent == "gt") r += '>';
    else if (ent == "quot") r += '"';
    else if (ent == "apos") r += '\'';
    else if (!ent.empty() && ent[0] == '#') {
      const long cp = ent.size() > 1 && (ent[1] == 'x' || ent[1] == 'X')
                          ? std::strtol(std::string(ent.substr(2)).c_str(), nullptr, 16)
                          : std::strtol(std::string(ent.substr(1)).c_str(), nullptr, 10);
      if (cp < 0x80) {
        r += static_cast<char>(cp);
      } else if (cp < 0x800) {
        r += static_cast<char>(0xC0 | (cp >> 6));
        r += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        r += static_cast<char>(0xE0 | (cp >> 12));
        r += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        r += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        r += static_cast<char>(0xF0 | (cp >> 18));
        r += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        r += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        r += static_cast<char>(0x80 | (cp & 0x3F));
      }
    } else {
      r.append(s.substr(i, semi - i + 1));
    }
    i = semi;
  }
  return r;
}

// Value of attribute `attr` in the tag text [tag_begin, tag_end), or npos-signalled empty optional.
bool attribute(std::string_view tag, std::string_view attr, std::string& out) {
  std::size_t pos = 0;
  while ((pos = tag.find(attr, pos)) != std::string_view::npos) {
    const bool boundary = pos > 0 && (tag[pos - 1] == ' ' || tag[pos - 1] == '\n' || tag[pos - 1] == '\t');
    const std::size_t eq = pos + attr.size();
    if (boundary && eq + 1 < tag.size() && tag[eq] == '=' && (tag[eq + 1] == '"' || tag[eq + 1] == '\'')) {
      const char q = tag[eq + 1];
      const std::size_t end = tag.find(q, eq + 2);
      if (end == std::string_view::npos) return false;
      out = xml_unescape(tag.substr(eq + 2, end - eq - 2));
      return true;
    }
    pos = eq;
  }
  return false;
}

// Finds the next element start `<name` followed by whitespace, '/' or '>'.
std::size_t find_tag(std::string_view xml, std::string_view name, std::size_t from) {
  std::string open = "<";
  open += name;
  for (std::size_t p = xml.find(open, from); p != std::string_view::npos; p = xml.find(open, p + 1)) {
    const std::size_t after = p + open.size();
    if (after < xml.size() && (xml[after] == ' ' || xml[after] == '/' || xml[after] == '>' || xml[after] == '\n'))
      return p;
  }
  return std::string_view::npos;
}

// End of the start tag that begins at `pos`: the first '>' outside a quoted attribute value
// ('>' may appear unescaped in attributes, e.g. a test named "FP8 -> fp8").
std::size_t tag_end(std::string_view xml, std::size_t pos) {
  char quote = 0;
  for (std::size_t i = pos; i < xml.size(); ++i) {
    const char ch = xml[i];
    if (quote) {
      if (ch == quote) quote = 0;
    } else if (ch == '"' || ch == '\'') {
      quote = ch;
    } else if (ch == '>') {
      return i;
    }
  }
  return std::string_view::npos;
}

std::string trimmed(std::string text) {
  const std::size_t b = text.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return text.substr(b, text.find_last_not_of(" \t\r\n") + 1 - b);
}

// Unescaped, trimmed text between the start tag of element `name` at `pos` and its end tag;
// empty if the element is self-closing or not closed before `limit`.
std::string element_text(std::string_view xml, std::string_view name, std::size_t pos, std::size_t limit) {
  const std::size_t open_end = tag_end(xml, pos);
  if (open_end == std::string_view::npos || open_end >= limit || xml[open_end - 1] == '/') return {};
  const std::string close = "</" + std::string(name) + ">";
  const std::size_t c = xml.find(close, open_end);
  if (c == std::string_view::npos || c > limit) return {};
  return trimmed(xml_unescape(xml.substr(open_end + 1, c - open_end - 1)));
}

// The first failure inside one test case [from, limit): a failing Expression's Original text,
// else the text of the first Failure, Exception or FatalErrorCondition element.
std::string first_failure(std::string_view xml, std::size_t from, std::size_t limit) {
  for (std::size_t e = find_tag(xml, "Expression", from); e != std::string_view::npos && e < limit;
       e = find_tag(xml, "Expression", e + 1)) {
    const std::size_t e_end = tag_end(xml, e);
    if (e_end == std::string_view::npos || e_end >= limit) break;
    std::string ok;
    if (!attribute(xml.substr(e, e_end - e), "success", ok) || ok != "false") continue;
    const std::size_t o = find_tag(xml, "Original", e_end);
    const std::size_t e_close = xml.find("</Expression>", e_end);
    if (o != std::string_view::npos && o < std::min(e_close, limit)) return element_text(xml, "Original", o, limit);
  }
  std::size_t best = std::string_view::npos;
  std::string_view best_name;
  for (std::string_view name : {"Failure", "Exception", "FatalErrorCondition"}) {
    const std::size_t f = find_tag(xml, name, from);
    if (f < limit && f < best) {
      best = f;
      best_name = name;
    }
  }
  return best == std::string_view::npos ? std::string{} : element_text(xml, best_name, best, limit);
}

// Everything a failed test case [from, limit) reported, in document order (CaseResult::output).
std::string case_output(std::string_view xml, std::size_t from, std::size_t limit) {
  std::string out;
  auto add = [&](const std::string& line) {
    if (!line.empty() && out.size() < 8000) out += (out.empty() ? "" : "\n") + line;
  };
  auto where = [&](std::string_view tag) {
    std::string file, line;
    attribute(tag, "filename", file);
    attribute(tag, "line", line);
    return file.empty() ? std::string() : file.substr(file.find_last_of('/') + 1) + ":" + line + ": ";
  };
  for (std::size_t p = xml.find('<', from); p != std::string_view::npos && p < limit; p = xml.find('<', p + 1)) {
    const std::size_t e = tag_end(xml, p);
    if (e == std::string_view::npos || e >= limit) break;
    const std::string_view tag = xml.substr(p, e - p);
    if (find_tag(xml, "Expression", p) == p) {
      std::string ok;
      if (!attribute(tag, "success", ok) || ok != "false") continue;
      // A crashed program's XML ends inside the element: read what is there and stop (with no limit,
      // `p = close` would wrap to the start of the text: an endless loop the driver hung in).
      const std::size_t close_tag = xml.find("</Expression>", e);
      const bool cut = close_tag == std::string_view::npos || close_tag >= limit;
      const std::size_t close = cut ? std::min(xml.size(), limit) : close_tag;
      std::string type;
      attribute(tag, "type", type);
      const std::size_t o = find_tag(xml, "Original", e), x = find_tag(xml, "Expanded", e);
      const std::string orig = o < close ? element_text(xml, "Original", o, close + 1) : std::string();
      const std::string exp = x < close ? element_text(xml, "Expanded", x, close + 1) : std::string();
      add(where(tag) + (type.empty() ? "CHECK" : type) + "( " + orig + " )" + (exp.empty() || exp == orig ? "" : "  with expansion: " + exp));
      if (cut) break;
      p = close;
      continue;
    }
    for (std::string_view name : {"Failure", "Exception", "FatalErrorCondition", "StdOut", "StdErr"})
      if (find_tag(xml, name, p) == p) {
        const std::string text = element_text(xml, name, p, limit);
        if (!text.empty()) add(where(tag) + (name == "StdOut" || name == "StdErr" ? std::string(name) + ": " : "") + text);
      }
  }
  return out.size() > 8000 ? out.substr(0, 8000) + "\n[...]" : out;
}

}  // namespace

std::vector<CaseResult> parse_catch_xml(std::string_view xml) {
  std::vector<CaseResult> out;
  std::size_t pos = 0;
  while ((pos = find_tag(xml, "TestCase", pos)) != std::string_view::npos) {
    const std::size_t end = tag_end(xml, pos);
    if (end == std::string_view::npos) break;
    CaseResult c;
    attribute(xml.substr(pos, end - pos), "name", c.name);
    attribute(xml.substr(pos, end - pos), "tags", c.tags);
    const std::size_t next_case = find_tag(xml, "TestCase", end);
    const std::size_t close = xml.find("</TestCase>", end);
    const std::size_t limit = std::min(next_case, close);
    const std::size_t res = find_tag(xml, "OverallResult", end);
    if (res != std::string_view::npos && res < limit) {
      const std::size_t res_end = tag_end(xml, res);
      if (res_end != std::string_view::npos) {
        const std::string_view tag = xml.substr(res, res_end - res);
        std::string v;
        if (attribute(tag, "success", v)) {
          c.has_result = true;
          c.success = v == "true";
        }
        if (attribute(tag, "durationInSeconds", v)) c.seconds = std::strtod(v.c_str(), nullptr);
        if (attribute(tag, "skips", v)) c.skipped = std::strtol(v.c_str(), nullptr, 10) > 0;
      }
    }
    // A case that cannot run here says so with WARN("SKIPPED: <reason>") and passes (Catch2 2 has
    // no SKIP(); the GPU gates do this without a device). Such a case proves nothing: skipped.
    for (std::size_t w = find_tag(xml, "Warning", end); w != std::string_view::npos && w < limit;
         w = find_tag(xml, "Warning", w + 1)) {
      const std::size_t w_end = tag_end(xml, w);
      const std::size_t w_close = xml.find("</Warning>", w);
      if (w_end == std::string_view::npos || w_close == std::string_view::npos || w_close < w_end) break;
      const std::string text = trimmed(xml_unescape(xml.substr(w_end + 1, w_close - w_end - 1)));
      if (text.empty()) continue;
      if (text.rfind("SKIPPED:", 0) == 0) {
        c.skip_reason = text.substr(8 + (text.size() > 8 && text[8] == ' ' ? 1 : 0));
        if (c.success) c.skipped = true;
        break;
      }
    }
    if (c.has_result && !c.success) c.failure = first_failure(xml, end, limit);
    if (!c.success) c.output = case_output(xml, end, limit);
    out.push_back(std::move(c));
    pos = end;
  }
  return out;
}

std::string gate_id_of(std::string_view name) {
  std::size_t b = 0;
  while (b < name.size() && (name[b] == ' ' || name[b] == '\t')) ++b;
  std::size_t e = b;
  while (e < name.size() && name[e] != ' ' && name[e] != '\t') ++e;
  return std::string(name.substr(b, e - b));
}

std::string catch_spec_for_gate(std::string_view id) {
  std::string esc;
  for (char c : id) {
    if (c == ',' || c == '[' || c == ']' || c == '*' || c == '~' || c == '\\' || c == '"') esc += '\\';
    esc += c;
  }
  return esc + " *," + esc;
}

}  // namespace kvgate::harness

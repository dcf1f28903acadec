// Typed records passed between the stages (`kvgate mutate` -> `kvgate signoff` -> reports), with one
// field table per record, llama-bench style: a row {name, type, required, description, getter,
// setter} per field, and the JSON writer (to_json), the JSON reader (from_json) and the Markdown
// printer (markdown_table) all walk that one table. A field added to a record is one row in its
// table; every printer picks it up. JSON appears only at the edge (the files).
//
// A record type R takes part by specialising FieldTable<R> with `static const std::vector<Field<R>>&
// fields()`; KVGATE_FIELD builds a row from a data member (string, int, double, bool, vectors,
// string-keyed maps, std::optional, nested records, and a nlohmann::json kept as it is).
#pragma once
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgate::records {

using json = nlohmann::json;

// The JSON type of a field, as its schema writes it.
enum class FieldType { string, integer, number, boolean, array, object };
const char* schema_type(FieldType t);  // "string", "integer", ...

// A record that cannot be read: which file, which field (JSON pointer), what is wrong, and the fix.
class RecordError : public std::runtime_error {
 public:
  RecordError(std::string file, std::string pointer, std::string problem, std::string fix);
  const std::string& file() const { return file_; }
  const std::string& pointer() const { return pointer_; }

 private:
  std::string file_, pointer_;
};

// A field-level problem found while reading (the file is added by the caller that knows it).
struct FieldError : std::runtime_error {
  std::string pointer;
  FieldError(std::string ptr, const std::string& what) : std::runtime_error(what), pointer(std::move(ptr)) {}
};

template <class R>
struct Field {
  const char* name;
  FieldType type;
  bool required;          // a reader refuses a record without it
  const char* description;
  json (*get)(const R&);
  void (*set)(R&, const json&, const std::string& pointer);  // throws FieldError
};

template <class R>
struct FieldTable;  // specialise: static const std::vector<Field<R>>& fields();

template <class R>
concept Record = requires { FieldTable<R>::fields(); };

// --- value conversion (used by KVGATE_FIELD) ------------------------------------------------------
template <class T>
json to_value(const T& v);
template <class T>
void from_value(const json& j, T& out, const std::string& pointer);

inline const char* json_kind(const json& j) { return j.type_name(); }

template <class T>
json to_value(const T& v) {
  if constexpr (std::is_same_v<T, json>) {  // a nested document kept as it is (another record's)
    return v;
  } else if constexpr (Record<T>) {
    json o = json::object();
    for (const auto& f : FieldTable<T>::fields()) o[f.name] = f.get(v);
    return o;
  } else if constexpr (std::is_same_v<T, std::string> || std::is_arithmetic_v<T>) {
    return json(v);
  } else if constexpr (requires { typename T::value_type; v.has_value(); }) {  // std::optional
    return v ? to_value(*v) : json(nullptr);
  } else if constexpr (requires { typename T::mapped_type; }) {  // std::map<std::string, X>
    json o = json::object();
    for (const auto& [k, x] : v) o[k] = to_value(x);
    return o;
  } else {  // std::vector<X>
    json a = json::array();
    for (const auto& x : v) a.push_back(to_value(x));
    return a;
  }
}

template <class T>
void from_value(const json& j, T& out, const std::string& pointer) {
  auto wrong = [&](const char* want) {
    throw FieldError(pointer, std::string("expected ") + want + ", found " + json_kind(j));
  };
  if constexpr (std::is_same_v<T, json>) {
    out = j;
  } else if constexpr (Record<T>) {
    if (!j.is_object()) wrong("an object");
    for (const auto& f : FieldTable<T>::fields()) {
      const std::string at = pointer + "/" + f.name;
      const auto it = j.find(f.name);
      if (it == j.end()) {
        if (f.required) throw FieldError(at, "is missing");
        continue;
      }
      f.set(out, *it, at);
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) wrong("a boolean");
    out = j.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!j.is_number_integer()) wrong("an integer");
    out = j.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!j.is_number()) wrong("a number");
    out = j.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) wrong("a string");
    out = j.get<std::string>();
  } else if constexpr (requires { typename T::value_type; out.has_value(); }) {  // std::optional
    if (j.is_null()) {
      out.reset();
    } else {
      typename T::value_type x{};
      from_value(j, x, pointer);
      out = std::move(x);
    }
  } else if constexpr (requires { typename T::mapped_type; }) {
    if (!j.is_object()) wrong("an object");
    out.clear();
    for (const auto& [k, x] : j.items()) from_value(x, out[k], pointer + "/" + k);
  } else {
    if (!j.is_array()) wrong("an array");
    out.clear();
    out.resize(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) from_value(j[i], out[i], pointer + "/" + std::to_string(i));
  }
}

// A row of a field table from a data member.
#define KVGATE_FIELD(R, member, type, required, description)                                            \
  ::kvgate::records::Field<R> {                                                                          \
    #member, ::kvgate::records::FieldType::type, required, description,                                  \
        [](const R& r) -> ::nlohmann::json { return ::kvgate::records::to_value(r.member); },            \
        [](R& r, const ::nlohmann::json& j, const std::string& p) { ::kvgate::records::from_value(j, r.member, p); } \
  }

// --- the three readers of a field table -----------------------------------------------------------
template <Record R>
json to_json(const R& r) {
  return to_value(r);
}

// Reads `j` into R; `file` names the document in the error (RecordError: file, field, fix).
template <Record R>
R from_json(const json& j, const std::string& file, const std::string& fix) {
  R r{};
  try {
    from_value(j, r, "");
  } catch (const FieldError& e) {
    throw RecordError(file, e.pointer, e.what(), fix);
  }
  return r;
}

// A Markdown cell of one JSON value: strings as they are, numbers with %.4g, arrays joined by ", ",
// booleans yes/no, null as "–"; '|' and newlines escaped.
std::string markdown_cell(const json& v);
std::string markdown_escape(const std::string& s);

// A Markdown table of records: one column per named field (empty: every field of the table), the
// header from the field names.
template <Record R>
std::string markdown_table(const std::vector<R>& rows, const std::vector<std::string>& columns = {}) {
  std::vector<const Field<R>*> cols;
  for (const auto& f : FieldTable<R>::fields())
    if (columns.empty()) cols.push_back(&f);
  for (const auto& c : columns) {
    const Field<R>* hit = nullptr;
    for (const auto& f : FieldTable<R>::fields())
      if (c == f.name) hit = &f;
    if (!hit) throw std::invalid_argument("markdown_table: the record has no field '" + c + "'");
    cols.push_back(hit);
  }
  std::string s = "|", rule = "|";
  for (const auto* f : cols) {
    s += std::string(" ") + f->name + " |";
    rule += (f->type == FieldType::number || f->type == FieldType::integer) ? "--:|" : "---|";
  }
  s += "\n" + rule + "\n";
  for (const auto& r : rows) {
    s += "|";
    for (const auto* f : cols) s += " " + markdown_cell(f->get(r)) + " |";
    s += "\n";
  }
  return s;
}

// A Markdown table describing the fields themselves (name, type, required, description): the
// record's documentation, printed from the same table.
template <Record R>
std::string markdown_fields(const std::string& record_name) {
  std::string s = "| " + record_name + " field | type | required | description |\n|---|---|---|---|\n";
  for (const auto& f : FieldTable<R>::fields())
    s += std::string("| `") + f.name + "` | " + schema_type(f.type) + " | " + (f.required ? "yes" : "no") + " | " +
         markdown_escape(f.description) + " |\n";
  return s;
}

// The field table against a JSON Schema object schema: every field is a property of the declared
// type, every required field is in "required", and the schema declares no property the table lacks.
// Returns the disagreements (empty: they agree).
template <Record R>
std::vector<std::string> table_vs_schema(const json& object_schema, const std::string& where) {
  std::vector<std::string> out;
  const json props = object_schema.value("properties", json::object());
  const json req = object_schema.value("required", json::array());
  for (const auto& f : FieldTable<R>::fields()) {
    if (!props.contains(f.name)) {
      out.push_back(where + ": field '" + f.name + "' is not a property of the schema");
      continue;
    }
    const json& p = props[f.name];
    if (p.contains("type")) {
      const json t = p["type"];
      bool ok = t == schema_type(f.type);
      if (t.is_array())
        for (const auto& x : t) ok = ok || x == schema_type(f.type);
      if (!ok) out.push_back(where + ": field '" + f.name + "' is " + schema_type(f.type) + ", the schema says " + t.dump());
    }
    const bool in_req = std::find(req.begin(), req.end(), json(f.name)) != req.end();
    if (in_req != f.required)
      out.push_back(where + ": field '" + f.name + "' is " + (f.required ? "required" : "optional") +
                    " in the table, " + (in_req ? "required" : "optional") + " in the schema");
  }
  for (const auto& [k, _] : props.items()) {
    bool known = false;
    for (const auto& f : FieldTable<R>::fields()) known = known || k == f.name;
    if (!known) out.push_back(where + ": the schema's property '" + k + "' is no field of the table");
  }
  return out;
}

}  // namespace kvgate::records

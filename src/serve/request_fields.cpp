#include "serve/request_fields.h"

#include <cmath>
#include <sstream>

namespace lattice {

template <class Json>
Json parse_request_body(const std::string& body) {
  Json j;
  try {
    j = Json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    throw RequestError(std::string("the request body is not JSON: ") + e.what());
  }
  if (!j.is_object()) throw RequestError("the request body is not a JSON object");
  return j;
}
template nlohmann::json parse_request_body<nlohmann::json>(const std::string&);
template nlohmann::ordered_json parse_request_body<nlohmann::ordered_json>(const std::string&);

void check_known_fields(const nlohmann::json& request, const std::set<std::string>& known) {
  for (auto it = request.begin(); it != request.end(); ++it)
    if (!known.count(it.key())) throw RequestError("unknown field \"" + it.key() + "\"");
}

namespace {

const nlohmann::json* present(const nlohmann::json& request, const std::string& name) {
  auto it = request.find(name);
  return it == request.end() || it->is_null() ? nullptr : &*it;
}

template <class T>
std::string range_text(T min, T max) {
  std::ostringstream s;
  s << "in [" << min << ", " << max << "]";
  return s.str();
}

}  // namespace

std::optional<bool> bool_field(const nlohmann::json& request, const std::string& name) {
  const nlohmann::json* v = present(request, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw RequestError(name + " must be true or false, got " + v->dump());
  return v->get<bool>();
}

std::optional<int64_t> int_field(const nlohmann::json& request, const std::string& name, int64_t min, int64_t max) {
  const nlohmann::json* v = present(request, name);
  if (!v) return std::nullopt;
  bool whole = v->is_number_integer() || (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                                          std::fabs(v->get<double>()) < 9e15);
  if (!whole) throw RequestError(name + " must be an integer " + range_text(min, max) + ", got " + v->dump());
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX
                    : v->is_number_float()                                              ? int64_t(v->get<double>())
                                                                                        : v->get<int64_t>();
  if (x < min || x > max) throw RequestError(name + " must be an integer " + range_text(min, max) + ", got " + v->dump());
  return x;
}

std::optional<double> number_field(const nlohmann::json& request, const std::string& name, double min, double max) {
  const nlohmann::json* v = present(request, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw RequestError(name + " must be a number " + range_text(min, max) + ", got " + v->dump());
  const double x = v->get<double>();
  if (!(x >= min && x <= max)) throw RequestError(name + " must be a number " + range_text(min, max) + ", got " + v->dump());
  return x;
}

}  // namespace lattice

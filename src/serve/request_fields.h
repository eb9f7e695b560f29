// Typed reads of a JSON request's fields for `lattice serve`'s endpoints. A field of the wrong type
// or out of range, or one the endpoint does not know, is a RequestError: the server answers
// 400 with its one-line message, which names the field.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace lattice {

struct RequestError : std::runtime_error {
  explicit RequestError(const std::string& what, int status = 400) : std::runtime_error(what), status(status) {}
  int status;
};

// The request body as a JSON object (a RequestError otherwise); Json: nlohmann::json, or ordered_json to
// keep the objects' keys in their order.
template <class Json = nlohmann::json>
Json parse_request_body(const std::string& body);

// Throws naming the first field of `request` that is not in `known`.
void check_known_fields(const nlohmann::json& request, const std::set<std::string>& known);

// A field's value, or nullopt when absent (or JSON null). Integers must be whole numbers;
// numbers take integers too. The range [min, max] is checked where given.
std::optional<bool> bool_field(const nlohmann::json& request, const std::string& name);
std::optional<int64_t> int_field(const nlohmann::json& request, const std::string& name, int64_t min, int64_t max);
std::optional<double> number_field(const nlohmann::json& request, const std::string& name, double min, double max);

}  // namespace lattice

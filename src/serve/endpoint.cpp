#include "serve/endpoint.h"

namespace lattice {

std::string json_text(const nlohmann::json& v) { return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace lattice

// Logging to stderr/stdout with a consistent prefix.
#pragma once
#include <cstdio>
#include <string>

namespace lattice {

void log_info(const std::string& msg);   // stdout, as Megatron prints its log lines
void log_warn(const std::string& msg);   // stderr, prefixed "warning: "

}  // namespace lattice

// Logging to stderr/stdout with a consistent prefix.
#pragma once
#include <cstdio>
#include <string>

namespace lattice {

void log_info(const std::string& msg);   // stdout, as Megatron prints its log lines
// With several ranks only one (rank 0) prints log lines; warnings and errors always print.
void set_log_info_enabled(bool enabled);
void log_on_this_rank(const std::string& msg);  // stdout on any rank: a rank's own report
void log_warn(const std::string& msg);   // stderr, prefixed "warning: "

}  // namespace lattice

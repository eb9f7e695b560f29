#include "cli/simple_flags.h"

#include <sstream>

#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace lattice {

std::vector<std::string> SimpleFlags::words(const std::string& name) const {
  std::vector<std::string> out;
  std::istringstream in(get(name, ""));
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string SimpleFlags::get(const std::string& name, const std::string& fallback) const {
  auto it = values.find(name);
  return it == values.end() ? fallback : it->second;
}

std::string SimpleFlags::required(const std::string& name) const {
  auto it = values.find(name);
  if (it == values.end()) LATTICE_FAIL() << "--" << name << " is required";
  return it->second;
}

double SimpleFlags::number(const std::string& name, double fallback) const {
  auto it = values.find(name);
  if (it == values.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || errno || *end != '\0')
    LATTICE_FAIL() << "--" << name << ": invalid number '" << it->second << "'";
  return v;
}

bool help_requested(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    const std::string tok = argv[i];
    if (tok == "--help" || tok == "-h") return true;
  }
  return false;
}

SimpleFlags parse_simple_flags(int argc, char** argv, int first, const std::set<std::string>& known_values,
                               const std::set<std::string>& known_switches) {
  SimpleFlags f;
  for (int i = first; i < argc; ++i) {
    std::string tok = argv[i];
    if (tok.rfind("--", 0) != 0) LATTICE_FAIL() << "unexpected argument '" << tok << "'";
    std::string name = tok.substr(2);
    if (known_switches.count(name)) {
      f.switches.insert(name);
    } else if (known_values.count(name)) {
      if (i + 1 >= argc) LATTICE_FAIL() << "--" << name << " needs a value";
      f.values[name] = argv[++i];
    } else {
      LATTICE_FAIL() << "unknown flag --" << name << " (lattice " << argv[first - 1] << " --help lists the flags)";
    }
  }
  return f;
}

}  // namespace lattice

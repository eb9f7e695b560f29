// Flag parsing for the small subcommands (plot, generate): --name value pairs and
// switches, checked against the subcommand's list of known flags.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

namespace lattice {

struct SimpleFlags {
  std::map<std::string, std::string> values;
  std::set<std::string> switches;

  bool has(const std::string& name) const { return values.count(name) || switches.count(name); }
  std::string get(const std::string& name, const std::string& fallback) const;
  std::string required(const std::string& name) const;
  double number(const std::string& name, double fallback) const;
  // The value's white-space separated words (none when the flag is absent).
  std::vector<std::string> words(const std::string& name) const;
};

// True when argv[first..] holds --help or -h: the subcommand prints its usage to stdout and
// exits 0, whatever else the line holds.
bool help_requested(int argc, char** argv, int first);

// known_values: flags that take a value; known_switches: flags without one. Names
// without the leading "--". Throws lattice::Error for unknown flags and missing values
// (naming `lattice <argv[1]> --help` for the list).
SimpleFlags parse_simple_flags(int argc, char** argv, int first, const std::set<std::string>& known_values,
                               const std::set<std::string>& known_switches);

}  // namespace lattice

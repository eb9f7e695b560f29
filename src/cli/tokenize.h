// `lattice tokenize` (a debugging aid, not in the usage list): text on stdin -> token ids on stdout,
// or ids -> text with --decode. The tokenizer reference test compares its output with node's.
#pragma once

namespace lattice {

// argv[0] is "tokenize". Returns the exit code; errors are thrown as lattice::Error.
int cmd_tokenize(int argc, char** argv);

}  // namespace lattice

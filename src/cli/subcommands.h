// The `lattice` subcommands. Each returns the exit code; errors are thrown as
// lattice::Error and printed by main as one line.
#pragma once

namespace lattice {

int cmd_train(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_convert(int argc, char** argv);
int cmd_plot(int argc, char** argv);
int cmd_schedule(int argc, char** argv);
int cmd_chat_template(int argc, char** argv);

}  // namespace lattice

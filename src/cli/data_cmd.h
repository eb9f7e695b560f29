// `lattice data samples|info`: inspect a dataset and the sample order training uses.
#pragma once

namespace lattice {

int cmd_data(int argc, char** argv);

}  // namespace lattice

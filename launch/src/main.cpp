// The leantrain executable: the command line of leantrain::cli (launch/src/cli.cpp) with the built-in kinds.
#include "leantrain/cli/cli.h"

int main(int argc, char** argv) { return lt::cli::main(argc, argv); }

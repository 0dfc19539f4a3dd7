/* main.c — the fsoff executable. */
#include "cli.h"

int main(int argc, char **argv)
{
    return fso_cli_main(argc, argv);
}

/* main.c — the fsoff executable: `fsoff plan` (plan_cli.h), `fsoff bench`
 * (bench/bench.h), `fsoff plot` (bench/plot.h), `fsoff export`
 * (export_cli.h), `fsoff tokenize` (tokenize_cli.h), and otherwise training
 * (cli.h). Under mpirun or srun each box runs one of these; boxes.h
 * starts MPI before anything else and finishes it after. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "boxes.h"
#include "cli.h"
#include "export_cli.h"
#include "plan_cli.h"
#include "plot.h"
#include "tokenize_cli.h"

static int dispatch(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "bench") == 0)
        return fso_bench_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "plan") == 0)
        return fso_plan_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "plot") == 0)
        return fso_plot_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "export") == 0)
        return fso_export_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "tokenize") == 0)
        return fso_tokenize_main(argc - 1, argv + 1);
    return fso_cli_main(argc, argv);
}

int main(int argc, char **argv)
{
    char err[512] = "";
    if (fso_boxes_init(&argc, &argv, err, sizeof err) != 0) {
        fprintf(stderr, "fsoff: error: %s\n", err);
        return 2;
    }
    int rc = dispatch(argc, argv);
    fso_boxes_finalize();
    return rc;
}

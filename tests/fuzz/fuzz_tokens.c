/* fuzz_tokens.c — training data files as users give them: the token file's
 * header and reader, and plain text (engine/data.c).
 *
 * Input: the file's bytes. Each input is loaded four ways: named x.bin
 * under data.format auto (a token file, or refused), the same with
 * data.documents "stream", named x.dat under auto (token file by its magic,
 * else text) and under tokens. A load gives an error with its message and
 * no tokens, or at least one sequence of tokens all below the vocabulary;
 * then a few micro-batches are drawn and checked: every token in range,
 * targets the inputs shifted by one or -1 (not counted), as many counted as
 * fso_data_next says, and with documents positions that start each row at
 * 0 and either restart at 0 or go up by one.
 */
#include <stdio.h>
#include <string.h>

#include "data.h"
#include "fuzz.h"

#define VOCAB 300 /* above 255, so text loads; below most uint16 values */
#define SEQ 8
#define BATCH 3

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct {
        const char *name;
        fso_data_format format;
        fso_data_docs docs;
    } runs[] = {{"x.bin", FSO_DATA_AUTO, FSO_DATA_DOCS_ISOLATE},
                {"x.bin", FSO_DATA_AUTO, FSO_DATA_DOCS_STREAM},
                {"x.dat", FSO_DATA_AUTO, FSO_DATA_DOCS_ISOLATE},
                {"x.dat", FSO_DATA_TOKENS, FSO_DATA_DOCS_ISOLATE}};
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        fso_config cfg;
        memset(&cfg, 0, sizeof cfg);
        snprintf(cfg.data.path, sizeof cfg.data.path, "%s", fuzz_file(runs[r].name, data, size));
        cfg.data.format = runs[r].format;
        cfg.data.documents = runs[r].docs;
        cfg.data.seq_len = SEQ;
        cfg.model.vocab_size = VOCAB;
        cfg.micro_batch = BATCH;
        fso_data d;
        if (fso_data_init(&d, &cfg) < 0) {
            FUZZ_CHECK(d.err[0] != '\0' && d.tokens == NULL);
            continue;
        }
        FUZZ_CHECK(d.tokens != NULL && d.n_tokens >= SEQ + 1);
        FUZZ_CHECK(!fso_data_documents(&d) || runs[r].docs == FSO_DATA_DOCS_ISOLATE);
        int32_t in[BATCH * SEQ], tg[BATCH * SEQ], pos[BATCH * SEQ];
        for (int step = 0; step < 4; step++) {
            size_t counted = fso_data_next(&d, in, tg, pos), seen = 0;
            for (int i = 0; i < BATCH * SEQ; i++) {
                FUZZ_CHECK(in[i] >= 0 && in[i] < VOCAB && tg[i] >= -1 && tg[i] < VOCAB);
                seen += tg[i] >= 0;
                if (i % SEQ != SEQ - 1 && tg[i] >= 0)
                    FUZZ_CHECK(tg[i] == in[i + 1]);
                if (fso_data_documents(&d))
                    FUZZ_CHECK(i % SEQ == 0 ? pos[i] == 0
                                            : pos[i] == 0 || pos[i] == pos[i - 1] + 1);
            }
            FUZZ_CHECK(seen == counted);
        }
        fso_data_free(&d);
    }
    return 0;
}

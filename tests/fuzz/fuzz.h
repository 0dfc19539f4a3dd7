/* fuzz.h — what fsoff's fuzz targets share.
 *
 * A target is one file defining LLVMFuzzerTestOneInput() over a parser that
 * reads what users hand fsoff (a config file and --set, a token file, the
 * probe cache, a safetensors file, text to tokenize). Each is built twice (tests/fuzz/meson.build):
 *   - with libFuzzer (-Dfuzz=true, clang): the coverage-guided fuzzer, run by
 *     .ci/run under ASan and UBSan from the committed seeds in corpus/NAME;
 *   - with replay.c (every build with tests): a test that feeds it every
 *     file of corpus/NAME and regressions/NAME (inputs the fuzzer once
 *     crashed on), so the normal suite, and its sanitizer builds, keep them.
 * A new target is a file here, a line in meson.build's table and a folder of
 * seeds. A target must not leak, and must abort (assert) on any answer the
 * parser may never give, so the fuzzer reports it.
 */
#ifndef FSO_FUZZ_H
#define FSO_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* This process's private temporary folder, made on the first call: it holds
 * only the files fuzz_file() wrote, and goes at exit. A target that must
 * open a path its input names keeps that path inside this folder. */
const char *fuzz_dir(void);

/* A file called `name` in fuzz_dir(), holding exactly data (rewritten on
 * every call). Aborts when it cannot be written: the target would test
 * nothing. */
const char *fuzz_file(const char *name, const uint8_t *data, size_t size);

/* Aborts with file:line and the condition when cond is false. */
#define FUZZ_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond))                                                                       \
            fuzz_fail(__FILE__, __LINE__, #cond);                                          \
    } while (0)
void fuzz_fail(const char *file, int line, const char *what) __attribute__((noreturn));

#endif

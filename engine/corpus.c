/* corpus.c — fsoff's built-in synthetic English-like corpus.
 *
 * fso_corpus_generate() fills a buffer with short paragraphs of simple
 * sentences drawn from a small grammar: a few hundred words, a handful of
 * sentence templates, fixed facts ("the river is long.") and one-digit
 * arithmetic ("3 plus 4 is 7."). The text has enough structure (spelling,
 * word order, facts that always hold, sums that are always right) for a tiny
 * byte-level model to show a falling loss within minutes on a CPU.
 *
 * Contract: exactly n_bytes are written, only printable ASCII, ' ' and '\n';
 * the last sentence is cut where the buffer ends. The output depends only on
 * (n_bytes, seed): the generator is a splitmix64 stream kept in this file.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "data.h"

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

typedef struct corpus_rng {
    uint64_t state;
} corpus_rng;

/* splitmix64: one 64-bit add and a mixing function per draw. */
static uint64_t rng_next(corpus_rng *r)
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) for small n (multiply-shift; the bias is negligible). */
static size_t rng_below(corpus_rng *r, size_t n)
{
    return (size_t)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

#define PICK(r, list) ((list)[rng_below((r), N_ELEMS(list))])

typedef struct corpus_out {
    char *buf;
    size_t n_bytes;
    size_t pos;
    int sentence_start;      /* next letter is capitalized */
} corpus_out;

static int out_full(const corpus_out *o)
{
    return o->pos >= o->n_bytes;
}

static void out_str(corpus_out *o, const char *s)
{
    for (; *s && o->pos < o->n_bytes; s++) {
        char c = *s;
        if (o->sentence_start && c != ' ') {
            if (c >= 'a' && c <= 'z')
                c = (char)(c - 'a' + 'A');
            o->sentence_start = 0;
        }
        o->buf[o->pos++] = c;
    }
}

static void out_digit(corpus_out *o, int v)
{
    char s[4];
    int i = 0;
    if (v >= 10)
        s[i++] = (char)('0' + v / 10);
    s[i++] = (char)('0' + v % 10);
    s[i] = '\0';
    out_str(o, s);
}

/* ---- the lexicon ---------------------------------------------------------- */

static const char *const names[] = {
    "Anna", "Tom", "Mira", "Oskar", "Lena", "Paul", "Ida", "Sam", "Nora", "Ben",
    "Clara", "Hugo", "Eva", "Max", "Rosa", "Leo",
};

static const char *const animals[] = {
    "cat", "dog", "bird", "horse", "fox", "rabbit", "goat", "owl", "mouse", "duck",
    "sheep", "frog",
};

static const char *const things[] = {
    "ball", "book", "cup", "hat", "chair", "lamp", "key", "apple", "letter", "basket",
    "coat", "spoon", "drum", "kite", "map", "bell",
};

static const char *const places[] = {
    "garden", "kitchen", "forest", "market", "school", "barn", "field", "village",
    "library", "harbor", "meadow", "station",
};

static const char *const adjectives[] = {
    "small", "big", "old", "young", "red", "green", "quiet", "happy", "brave",
    "tired", "clever", "gentle", "bright", "little", "heavy", "warm",
};

static const char *const trans_verbs[] = {
    "sees", "finds", "carries", "likes", "holds", "wants", "brings", "watches",
    "follows", "paints", "opens", "drops",
};

static const char *const intrans_verbs[] = {
    "sleeps", "runs", "sings", "waits", "laughs", "walks", "jumps", "rests",
    "plays", "listens",
};

static const char *const adverbs[] = {
    "slowly", "quickly", "quietly", "happily", "often", "again", "today",
    "at night", "in the morning", "all day",
};

static const char *const connectives[] = {
    "then", "later", "after that", "soon", "in the end",
};

/* Facts that always hold: the model can learn the completion of each. */
typedef struct corpus_fact {
    const char *subject;
    const char *property;
} corpus_fact;

static const corpus_fact facts[] = {
    {"the river", "long"},   {"the sun", "hot"},      {"snow", "cold"},
    {"grass", "green"},      {"the sky", "blue"},     {"the night", "dark"},
    {"a stone", "hard"},     {"honey", "sweet"},      {"the sea", "deep"},
    {"a feather", "light"},  {"fire", "hot"},         {"ice", "cold"},
    {"the moon", "round"},   {"a lemon", "sour"},     {"the mountain", "high"},
    {"milk", "white"},
};

static const char *const plural_counts[] = {
    "two", "three", "four", "five", "six", "seven", "eight", "nine",
};

/* ---- sentences ------------------------------------------------------------ */

/* "the brave fox", "Anna", "the cat" */
static void out_subject(corpus_out *o, corpus_rng *r)
{
    switch (rng_below(r, 3)) {
    case 0:
        out_str(o, PICK(r, names));
        break;
    case 1:
        out_str(o, "the ");
        out_str(o, PICK(r, animals));
        break;
    default:
        out_str(o, "the ");
        out_str(o, PICK(r, adjectives));
        out_str(o, " ");
        out_str(o, PICK(r, animals));
        break;
    }
}

/* "the cup", "a heavy box", "an apple" */
static void out_object(corpus_out *o, corpus_rng *r)
{
    int definite = (int)rng_below(r, 2);
    const char *adj = rng_below(r, 2) ? PICK(r, adjectives) : NULL;
    const char *noun = rng_below(r, 3) ? PICK(r, things) : PICK(r, animals);
    const char *first = adj ? adj : noun;

    if (definite)
        out_str(o, "the ");
    else
        out_str(o, strchr("aeiou", first[0]) ? "an " : "a ");
    if (adj) {
        out_str(o, adj);
        out_str(o, " ");
    }
    out_str(o, noun);
}

static void out_sentence(corpus_out *o, corpus_rng *r)
{
    o->sentence_start = 1;
    switch (rng_below(r, 10)) {
    case 0: /* the old fox finds a red ball. */
    case 1:
        out_subject(o, r);
        out_str(o, " ");
        out_str(o, PICK(r, trans_verbs));
        out_str(o, " ");
        out_object(o, r);
        out_str(o, ".");
        break;
    case 2: /* Tom sings quietly. */
        out_subject(o, r);
        out_str(o, " ");
        out_str(o, PICK(r, intrans_verbs));
        out_str(o, " ");
        out_str(o, PICK(r, adverbs));
        out_str(o, ".");
        break;
    case 3: /* the dog is in the garden. */
        out_subject(o, r);
        out_str(o, " is in the ");
        out_str(o, PICK(r, places));
        out_str(o, ".");
        break;
    case 4: { /* the river is long. */
        const corpus_fact *f = &facts[rng_below(r, N_ELEMS(facts))];
        out_str(o, f->subject);
        out_str(o, " is ");
        out_str(o, f->property);
        out_str(o, ".");
        break;
    }
    case 5: { /* 3 plus 4 is 7. / 9 minus 2 is 7. */
        int a = (int)rng_below(r, 10), b = (int)rng_below(r, 10);
        if (rng_below(r, 2)) {
            out_digit(o, a);
            out_str(o, " plus ");
            out_digit(o, b);
            out_str(o, " is ");
            out_digit(o, a + b);
        } else {
            if (b > a) {
                int t = a;
                a = b;
                b = t;
            }
            out_digit(o, a);
            out_str(o, " minus ");
            out_digit(o, b);
            out_str(o, " is ");
            out_digit(o, a - b);
        }
        out_str(o, ".");
        break;
    }
    case 6: /* then the cat walks to the market. */
        out_str(o, PICK(r, connectives));
        out_str(o, " ");
        out_subject(o, r);
        out_str(o, " walks to the ");
        out_str(o, PICK(r, places));
        out_str(o, ".");
        break;
    case 7: /* when the owl sleeps, the duck waits too. */
        out_str(o, "when ");
        out_subject(o, r);
        out_str(o, " ");
        out_str(o, PICK(r, intrans_verbs));
        out_str(o, ", ");
        out_subject(o, r);
        out_str(o, " ");
        out_str(o, PICK(r, intrans_verbs));
        out_str(o, " too.");
        break;
    case 8: /* Lena has three red apples. */
        out_str(o, PICK(r, names));
        out_str(o, " has ");
        out_str(o, PICK(r, plural_counts));
        out_str(o, " ");
        out_str(o, PICK(r, adjectives));
        out_str(o, " ");
        out_str(o, PICK(r, things));
        out_str(o, "s.");
        break;
    default: /* Is the sun hot? Yes, the sun is hot. */
        if (rng_below(r, 2)) {
            const corpus_fact *f = &facts[rng_below(r, N_ELEMS(facts))];
            out_str(o, "is ");
            out_str(o, f->subject);
            out_str(o, " ");
            out_str(o, f->property);
            out_str(o, "?");
            o->sentence_start = 1;
            out_str(o, " yes, ");
            out_str(o, f->subject);
            out_str(o, " is ");
            out_str(o, f->property);
            out_str(o, ".");
        } else {
            out_str(o, "the ");
            out_str(o, PICK(r, animals));
            out_str(o, " and the ");
            out_str(o, PICK(r, animals));
            out_str(o, " are friends.");
        }
        break;
    }
}

void fso_corpus_generate(char *buf, size_t n_bytes, uint64_t seed)
{
    corpus_out o = {.buf = buf, .n_bytes = n_bytes, .pos = 0, .sentence_start = 1};
    corpus_rng r = {.state = seed};

    while (!out_full(&o)) {
        size_t n_sentences = 3 + rng_below(&r, 4);
        for (size_t i = 0; i < n_sentences && !out_full(&o); i++) {
            if (i > 0)
                out_str(&o, " ");
            out_sentence(&o, &r);
        }
        out_str(&o, "\n");
    }
}

// llmlab-oracle: llama.cpp's logits for a prompt, for a build llmlab cannot load through
// llama-cpp-python (an aarch64 build run under qemu-user). Built against the llama.cpp vendored in
// llama-cpp-python's sdist by `make oracle-arm64`; compiled into the same static binary as llama.cpp.
//
//   llmlab-oracle MODEL OUT [--ids 1,2,3 | --text-file F] [-fa on|off] [-t N] [-c N] [-b N] [-ub N]
//                 [-n N] [--all-logits] [--dump-nodes]
//
// Writes OUT.json ({system_info, n_vocab, prompt_ids, greedy, ...}) and OUT.logits (float32 rows of
// n_vocab: every prompt position with --all-logits, else the last one; then the logits after each
// greedy token but the last, which is not decoded), and
// with --dump-nodes OUT.nodes (every f32/f16 node the graph computes, in order: name, ne[4], data
// as float32). Defaults are llama-cpp-python's Llama(): n_ctx 512, n_batch 512, n_ubatch 512,
// flash attention off, f16 KV cache; the prompt is tokenized with BOS and special tokens.
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void die(const std::string & msg) {
    fprintf(stderr, "error: %s\n", msg.c_str());
    exit(2);
}

static FILE * g_nodes = nullptr;

// cb_eval: ask for every f32/f16 node, then write its values as float32 (ggml's own conversion)
static bool dump_node(struct ggml_tensor * t, bool ask, void *) {
    const bool wanted = t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16;
    if (ask) {
        return wanted;
    }
    if (!wanted || !ggml_is_contiguous(t)) {
        return true;
    }
    const int64_t n = ggml_nelements(t);
    std::vector<uint8_t> raw(ggml_nbytes(t));
    ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
    std::vector<float> f(n);
    if (t->type == GGML_TYPE_F16) {
        ggml_fp16_to_fp32_row((const ggml_fp16_t *) raw.data(), f.data(), n);
    } else {
        memcpy(f.data(), raw.data(), n * sizeof(float));
    }
    const uint32_t len = (uint32_t) strlen(t->name);
    fwrite(&len, 4, 1, g_nodes);
    fwrite(t->name, 1, len, g_nodes);
    fwrite(t->ne, sizeof(int64_t), 4, g_nodes);
    fwrite(f.data(), sizeof(float), n, g_nodes);
    return true;
}

static int arg_int(int & i, int argc, char ** argv) {
    if (++i >= argc) die(std::string("missing value after ") + argv[i - 1]);
    char * end = nullptr;
    long v = strtol(argv[i], &end, 10);
    if (*end || v < 0 || v > (1 << 24)) die(std::string("bad number: ") + argv[i]);
    return (int) v;
}

int main(int argc, char ** argv) {
    if (argc < 3) die("usage: llmlab-oracle MODEL OUT [--ids A,B | --text-file F] [-fa on|off] [-t N] [-c N] [-b N] [-ub N] [-n N] [--all-logits] [--dump-nodes]");
    const std::string model_path = argv[1], out = argv[2];
    std::string ids_arg, text_file;
    bool flash = false, all_logits = false, dump = false;
    int threads = 2, n_ctx = 512, n_batch = 512, n_ubatch = 512, n_predict = 0;
    for (int i = 3; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--ids" && i + 1 < argc)            ids_arg = argv[++i];
        else if (a == "--text-file" && i + 1 < argc) text_file = argv[++i];
        else if (a == "-fa" && i + 1 < argc) {
            const std::string v = argv[++i];
            if (v != "on" && v != "off") die("-fa takes on or off");
            flash = v == "on";
        }
        else if (a == "-t")  threads = arg_int(i, argc, argv);
        else if (a == "-c")  n_ctx = arg_int(i, argc, argv);
        else if (a == "-b")  n_batch = arg_int(i, argc, argv);
        else if (a == "-ub") n_ubatch = arg_int(i, argc, argv);
        else if (a == "-n")  n_predict = arg_int(i, argc, argv);
        else if (a == "--all-logits") all_logits = true;
        else if (a == "--dump-nodes") dump = true;
        else die("unknown argument " + a);
    }

    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) die("cannot load " + model_path);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::vector<llama_token> ids;
    if (!ids_arg.empty()) {
        std::stringstream ss(ids_arg);
        std::string tok;
        while (std::getline(ss, tok, ',')) {
            char * end = nullptr;
            long v = strtol(tok.c_str(), &end, 10);
            if (*end || v < 0 || v >= n_vocab) die("bad token id " + tok);
            ids.push_back((llama_token) v);
        }
    } else {
        std::ifstream f(text_file, std::ios::binary);
        if (!f) die("cannot read " + text_file);
        const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        ids.resize(text.size() + 16);
        int n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), ids.data(), (int32_t) ids.size(), true, true);
        if (n < 0) die("tokenize failed");
        ids.resize(n);
    }
    if (ids.empty() || (int) ids.size() + n_predict > n_ctx) die("the prompt and the continuation must fit in n_ctx");

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_ubatch;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.flash_attn_type = flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if (dump) {
        g_nodes = fopen((out + ".nodes").c_str(), "wb");
        if (!g_nodes) die("cannot write " + out + ".nodes");
        cp.cb_eval = dump_node;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a context");

    FILE * logits = fopen((out + ".logits").c_str(), "wb");
    if (!logits) die("cannot write " + out + ".logits");
    // the prompt, in batches of n_batch, as llama-cpp-python's Llama.eval feeds it
    const int n = (int) ids.size();
    for (int i0 = 0; i0 < n; i0 += n_batch) {
        const int nb = std::min(n_batch, n - i0);
        llama_batch batch = llama_batch_init(nb, 0, 1);
        for (int j = 0; j < nb; j++) {
            batch.token[j] = ids[i0 + j];
            batch.pos[j] = i0 + j;
            batch.n_seq_id[j] = 1;
            batch.seq_id[j][0] = 0;
            batch.logits[j] = all_logits || i0 + j == n - 1;
        }
        batch.n_tokens = nb;
        if (llama_decode(ctx, batch) != 0) die("llama_decode failed on the prompt");
        for (int j = 0; j < nb; j++) {
            if (batch.logits[j]) fwrite(llama_get_logits_ith(ctx, j), sizeof(float), n_vocab, logits);
        }
        llama_batch_free(batch);
    }
    // greedy continuation: argmax (the first of equal maxima), one token per decode
    std::vector<llama_token> greedy;
    const float * last = llama_get_logits_ith(ctx, -1);
    for (int step = 0; step < n_predict; step++) {
        int best = 0;
        for (int v = 1; v < n_vocab; v++) if (last[v] > last[best]) best = v;
        greedy.push_back(best);
        if (llama_vocab_is_eog(vocab, best) || step + 1 == n_predict) break;
        llama_token tok = best;
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) die("llama_decode failed while generating");
        last = llama_get_logits_ith(ctx, -1);
        fwrite(last, sizeof(float), n_vocab, logits);
    }
    fclose(logits);
    if (g_nodes) fclose(g_nodes);

    FILE * js = fopen((out + ".json").c_str(), "w");
    if (!js) die("cannot write " + out + ".json");
    fprintf(js, "{\"system_info\": \"%s\", \"n_vocab\": %d, \"flash_attn\": %s, \"n_threads\": %d, \"all_logits\": %s, \"prompt_ids\": [",
            llama_print_system_info(), n_vocab, flash ? "true" : "false", threads, all_logits ? "true" : "false");
    for (int i = 0; i < n; i++) fprintf(js, "%s%d", i ? ", " : "", ids[i]);
    fprintf(js, "], \"greedy\": [");
    for (size_t i = 0; i < greedy.size(); i++) fprintf(js, "%s%d", i ? ", " : "", greedy[i]);
    fprintf(js, "]}\n");
    fclose(js);

    llama_free(ctx);
    llama_model_free(model);
    return 0;
}

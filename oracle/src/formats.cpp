// Half formats, page layout, quantize / dequantize: docs/FORMATS.md, literally.
#include "kvgate_oracle/formats.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace kvgate_oracle {

// ---- names --------------------------------------------------------------------------------

const char* half_name(Half h) {
    switch (h) {
        case Half::f32: return "f32";
        case Half::f16: return "f16";
        case Half::bf16: return "bf16";
        case Half::int8: return "int8";
        case Half::fp8_e4m3: return "fp8_e4m3";
        case Half::fp8_e5m2: return "fp8_e5m2";
        case Half::q8_0: return "q8_0";
        case Half::q4_0: return "q4_0";
        case Half::q4_0_rot: return "q4_0_rot";
        case Half::mxfp8: return "mxfp8";
        case Half::mxfp4: return "mxfp4";
        case Half::nvfp4: return "nvfp4";
        case Half::fp8_per_token_head: return "fp8_per_token_head";
        case Half::int8_per_token_head: return "int8_per_token_head";
        case Half::fp8_block128: return "fp8_block128";
    }
    return "?";
}

std::optional<Half> parse_half(std::string_view name) {
    for (Half h : kAllHalves)
        if (name == half_name(h)) return h;
    if (name == "fp8") return Half::fp8_e4m3;
    return std::nullopt;
}

struct Preset { const char* name; KvPair pair; };
static constexpr Preset kPresets[] = {
    {"f32", {Half::f32, Half::f32}},       {"f16", {Half::f16, Half::f16}},
    {"bf16", {Half::bf16, Half::bf16}},    {"int8", {Half::int8, Half::int8}},
    {"fp8", {Half::fp8_e4m3, Half::fp8_e4m3}}, {"fp8_e5m2", {Half::fp8_e5m2, Half::fp8_e5m2}},
    {"q8_0", {Half::q8_0, Half::q8_0}},    {"q4_0", {Half::q4_0, Half::q4_0}},
    {"k8v4", {Half::int8, Half::q4_0_rot}},
    {"mxfp8", {Half::mxfp8, Half::mxfp8}}, {"mxfp4", {Half::mxfp4, Half::mxfp4}},
    {"k_mxfp8_v_mxfp4", {Half::mxfp8, Half::mxfp4}}, {"nvfp4", {Half::nvfp4, Half::nvfp4}},
    {"fp8_per_token_head", {Half::fp8_per_token_head, Half::fp8_per_token_head}},
    {"int8_per_token_head", {Half::int8_per_token_head, Half::int8_per_token_head}},
    {"fp8_block128", {Half::fp8_block128, Half::fp8_block128}},
};

std::optional<KvPair> parse_preset(std::string_view name) {
    for (const Preset& p : kPresets)
        if (name == p.name) return p.pair;
    if (name == "fp8_e4m3") return KvPair{Half::fp8_e4m3, Half::fp8_e4m3};
    return std::nullopt;
}

std::string pair_name(KvPair p) {
    for (const Preset& q : kPresets)
        if (q.pair.k == p.k && q.pair.v == p.v) return q.name;
    return std::string("k=") + half_name(p.k) + ",v=" + half_name(p.v);
}

bool is_mx(Half h) { return h == Half::mxfp8 || h == Half::mxfp4; }
static bool is_per_token_head(Half h) { return h == Half::fp8_per_token_head || h == Half::int8_per_token_head; }
bool is_block32(Half h) { return h == Half::q8_0 || h == Half::q4_0 || h == Half::q4_0_rot || is_mx(h); }

// ---- geometry -----------------------------------------------------------------------------

static constexpr size_t kQ8Block = 34, kQ4Block = 18;  // f16 d + 32 int8 / 16 packed nibbles

std::optional<std::string> refusal_reason(Half h, PageShape s) {
    if (s.block_size <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0) return "bad_shape";
    // q4_0_rot rotates first (needs D = 2^k), then stores the row as q4_0.
    if (h == Half::q4_0_rot && !std::has_single_bit(unsigned(s.head_dim)))
        return "head_dim_not_power_of_two";
    if (is_block32(h) && (size_t(s.n_kv_heads) * size_t(s.head_dim)) % 32 != 0)
        return "row_not_multiple_of_32";
    if (h == Half::nvfp4 && (size_t(s.n_kv_heads) * size_t(s.head_dim)) % 16 != 0)
        return "row_not_multiple_of_16";
    if (h == Half::fp8_block128 && (size_t(s.n_kv_heads) * size_t(s.head_dim)) % 128 != 0)
        return "row_not_multiple_of_128";
    return std::nullopt;
}

static void require(Half h, PageShape s) {
    if (auto r = refusal_reason(h, s)) throw std::invalid_argument(*r);
}

// Bytes of one token slot inside the page's first run (codes or blocks).
static size_t row_code_bytes(Half h, PageShape s) {
    size_t n = size_t(s.n_kv_heads) * size_t(s.head_dim);  // H·D elements per token row
    switch (h) {
        case Half::f32: return 4 * n;
        case Half::f16:
        case Half::bf16: return 2 * n;
        case Half::int8:
        case Half::fp8_e4m3:
        case Half::fp8_e5m2:
        case Half::fp8_per_token_head:
        case Half::int8_per_token_head:
        case Half::fp8_block128: return n;
        case Half::q8_0: return (n / 32) * kQ8Block;
        case Half::q4_0:
        case Half::q4_0_rot: return (n / 32) * kQ4Block;
        case Half::mxfp8: return n;      // one E4M3 byte per element
        case Half::mxfp4:
        case Half::nvfp4: return n / 2;  // two E2M1 nibbles per byte
    }
    return 0;
}

size_t page_bytes(Half h, PageShape s) {
    require(h, s);
    size_t B = size_t(s.block_size), H = size_t(s.n_kv_heads);
    size_t bytes = B * row_code_bytes(h, s);
    if (h == Half::int8) bytes += 2 * B * H;  // scales [B][H] f16 after all codes
    if (is_per_token_head(h)) bytes += 4 * B * H;  // scales [B][H] f32 after all codes
    if (is_mx(h)) bytes += B * (size_t(s.n_kv_heads) * size_t(s.head_dim) / 32);  // scales [B][H·D/32] UE8M0
    if (h == Half::nvfp4) bytes += B * (size_t(s.n_kv_heads) * size_t(s.head_dim) / 16);  // scales [B][H·D/16] E4M3
    if (h == Half::fp8_block128) bytes += 4 * B * (size_t(s.n_kv_heads) * size_t(s.head_dim) / 128);  // [B][H·D/128] f32
    return bytes;
}

double bytes_per_cell(Half h, PageShape s) {
    return double(page_bytes(h, s)) / (double(s.block_size) * double(s.n_kv_heads));
}

static void check_slot(PageShape s, int slot) {
    if (slot < 0 || slot >= s.block_size) throw std::out_of_range("slot outside the page");
}

std::vector<std::pair<size_t, size_t>> slot_byte_ranges(Half h, PageShape s, int slot) {
    require(h, s);
    check_slot(s, slot);
    size_t rb = row_code_bytes(h, s);
    std::vector<std::pair<size_t, size_t>> r{{size_t(slot) * rb, rb}};
    if (h == Half::int8) {
        size_t H = size_t(s.n_kv_heads);
        r.emplace_back(size_t(s.block_size) * rb + size_t(slot) * H * 2, H * 2);
    }
    if (is_per_token_head(h)) {
        size_t H = size_t(s.n_kv_heads);
        r.emplace_back(size_t(s.block_size) * rb + size_t(slot) * H * 4, H * 4);
    }
    if (is_mx(h) || h == Half::nvfp4) {
        size_t nb = size_t(s.n_kv_heads) * size_t(s.head_dim) / (h == Half::nvfp4 ? 16 : 32);
        r.emplace_back(size_t(s.block_size) * rb + size_t(slot) * nb, nb);
    }
    if (h == Half::fp8_block128) {
        size_t nb = size_t(s.n_kv_heads) * size_t(s.head_dim) / 128;  // one f32 scale per 128-tile
        r.emplace_back(size_t(s.block_size) * rb + size_t(slot) * nb * 4, nb * 4);
    }
    return r;
}

// ---- little-endian helpers -----------------------------------------------------------------

static void put_u16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v & 0xFF); p[1] = uint8_t(v >> 8); }
static uint16_t get_u16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }
static void put_f32(uint8_t* p, float x) {
    uint32_t u; std::memcpy(&u, &x, 4);
    for (int b = 0; b < 4; ++b) p[b] = uint8_t(u >> (8 * b));
}
static float get_f32(const uint8_t* p) {
    uint32_t u = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    float x; std::memcpy(&x, &u, 4);
    return x;
}

// clamp(r, lo, hi) for an integral binary32 r (±inf clamps); NaN (outside every format's
// domain, FORMATS.md leaves it open) -> the code of zero.
static int clamp_code(float r, int lo, int hi, int nan_code) {
    if (std::isnan(r)) return nan_code;
    if (r < float(lo)) return lo;
    if (r > float(hi)) return hi;
    return int(r);
}

// max |x[i]| exactly; NaN never wins a comparison, so it is ignored.
static float absmax(const float* x, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; ++i) if (std::fabs(x[i]) > a) a = std::fabs(x[i]);
    return a;
}

// ---- int8 cell / q8_0 block: symmetric, smallest f16 scale with 127·s >= amax -------------

void quantize_cell_int8(const float* x, int D, int8_t* codes, uint16_t* scale) {
    float amax = absmax(x, D);
    *scale = f16_min_scale(amax, 127);  // +0 when amax == 0
    float s = from_f16(*scale);
    for (int i = 0; i < D; ++i) codes[i] = int8_t(s == 0.0f ? 0 : clamp_code(std::nearbyint(x[i] / s), -127, 127, 0));
}

void quantize_block_q8_0(const float* x, uint8_t* blk) {
    int8_t qs[32];
    uint16_t d;
    quantize_cell_int8(x, 32, qs, &d);  // same arithmetic, over the 32-block
    put_u16(blk, d);
    std::memcpy(blk + 2, qs, 32);
}

void dequantize_block_q8_0(const uint8_t* blk, float* x) {
    float d = from_f16(get_u16(blk));
    for (int i = 0; i < 32; ++i) x[i] = float(int8_t(blk[2 + i])) * d;
}

// ---- q4_0 block: d = -sign(m)·(smallest f16 with 8|d| >= |m|), code = rint(x/d)+8 ------------

void quantize_block_q4_0(const float* x, uint8_t* blk) {
    int im = -1;  // index of the element with the largest |x|, lowest index on ties
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i)
        if (std::fabs(x[i]) > amax) { amax = std::fabs(x[i]); im = i; }
    uint8_t code[32];
    uint16_t dbits = 0x0000;
    if (im < 0) {  // m == 0
        for (int i = 0; i < 32; ++i) code[i] = 8;
    } else {
        float m = x[im];
        dbits = uint16_t(f16_min_scale(amax, 8) | (m > 0.0f ? 0x8000 : 0x0000));  // d = -sign(m)|d|
        float d = from_f16(dbits);
        for (int i = 0; i < 32; ++i) {
            code[i] = uint8_t(clamp_code(std::nearbyint(x[i] / d) + 8.0f, 0, 15, 8));
        }
    }
    put_u16(blk, dbits);
    for (int j = 0; j < 16; ++j) blk[2 + j] = uint8_t(code[j] | (code[j + 16] << 4));
}

void dequantize_block_q4_0(const uint8_t* blk, float* x) {
    float d = from_f16(get_u16(blk));
    for (int j = 0; j < 16; ++j) {
        x[j] = float(int(blk[2 + j] & 0x0F) - 8) * d;
        x[j + 16] = float(int(blk[2 + j] >> 4) - 8) * d;
    }
}

// ---- MX block: X = 2^(floor(log2 amax) - emax), element = RNE(x / X) saturated --------------

uint8_t quantize_block_mx(Half h, const float* x, uint8_t* codes) {
    const int emax = h == Half::mxfp8 ? 8 : 2;  // largest normal exponent: 448 = 1.75·2^8, 6 = 1.5·2^2
    double amax = 0;
    for (int i = 0; i < 32; ++i)
        if (std::fabs(double(x[i])) > amax) amax = std::fabs(double(x[i]));  // NaN never wins
    if (std::isinf(amax)) {  // the NaN scale: the whole block reads NaN
        for (int i = 0; i < 32; ++i) codes[i] = 0;
        return 0xFF;
    }
    int ex = -127;  // all-zero (and tiny) blocks: the smallest scale, code 0
    if (amax > 0) {
        int e2;
        std::frexp(amax, &e2);  // amax = f·2^e2, f in [0.5, 1): floor(log2 amax) = e2 - 1
        ex = std::max(e2 - 1 - emax, -127);
    }
    const double X = std::ldexp(1.0, ex);
    for (int i = 0; i < 32; ++i) {
        const float y = float(double(x[i]) / X);  // exact where it matters (X is a power of two)
        codes[i] = h == Half::mxfp8 ? to_e4m3(y) : to_e2m1(y);
    }
    return uint8_t(ex + 127);
}

// ---- nvfp4 16-block: sb = e4m3((amax / 6) / g), S = e4m3(sb)·g, element = e2m1(x / S) -------

uint8_t quantize_block_nvfp4(const float* x, float g, uint8_t* codes) {
    const float amax = absmax(x, 16);                  // NaN ignored
    const float t = (amax / 6.0f) / g;                 // binary32, in this order
    const uint8_t sb = to_e4m3(t);                     // RNE, saturating at 448
    const float S = from_e4m3(sb) * g;                 // binary32
    for (int i = 0; i < 16; ++i) codes[i] = S == 0.0f ? uint8_t(0) : to_e2m1(x[i] / S);
    return sb;
}

// ---- fp8_per_token_head / int8_per_token_head cell: s = amax/qmax (binary32), codes of x/s ------

float quantize_cell_per_token_head(Half h, const float* x, int D, uint8_t* codes) {
    const bool fp8 = h == Half::fp8_per_token_head;
    float amax = 0.0f;  // over the finite elements: NaN and ±inf never set it
    for (int i = 0; i < D; ++i)
        if (std::isfinite(x[i]) && std::fabs(x[i]) > amax) amax = std::fabs(x[i]);
    float sc = amax / (fp8 ? 448.0f : 127.0f);  // binary32 RNE
    if (sc == 0.0f) sc = 1.0f;                   // all-zero cell, or the quotient underflowed
    for (int i = 0; i < D; ++i) {
        const float y = x[i] / sc;  // binary32
        codes[i] = fp8 ? to_e4m3(y) : uint8_t(int8_t(clamp_code(std::nearbyint(y), -127, 127, 0)));
    }
    return sc;
}

// ---- fp8_block128 tile: the fp8_per_token_head rule over 128 elements of the token row ----------

float quantize_tile_fp8_block128(const float* x, uint8_t* codes) {
    return quantize_cell_per_token_head(Half::fp8_per_token_head, x, 128, codes);  // FORMATS.md: the same rule
}

// ---- Walsh–Hadamard -----------------------------------------------------------------------

void hadamard(float* y, int n) {
    for (int len = 1; len < n; len <<= 1)
        for (int i = 0; i < n; ++i)
            if ((i & len) == 0) {
                float a = y[i], b = y[i + len];
                y[i] = a + b;
                y[i + len] = a - b;
            }
    const float c = float(1.0 / std::sqrt(double(n)));
    for (int i = 0; i < n; ++i) y[i] = y[i] * c;
}

void hadamard_f64(double* x, int n) {
    Eigen::MatrixXd H(n, n);
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) H(i, j) = (std::popcount(unsigned(i & j)) & 1) ? -1.0 : 1.0;
    Eigen::Map<Eigen::VectorXd> v(x, n);
    Eigen::VectorXd y = (H / std::sqrt(double(n))) * v;
    v = y;
}

// ---- one token slot --------------------------------------------------------------------------

// Head h's scale from the per-head list (size checked); fp8 divides head h's elements by it.
static void check_head_scales(Half h, PageShape s, const std::vector<float>& hs) {
    if (int(hs.size()) != s.n_kv_heads) throw std::invalid_argument("one scale per KV head expected");
    for (float x : hs)
        if (!(x > 0.0f) || !std::isfinite(x)) throw std::invalid_argument("KV scales must be finite and > 0");
    if (h == Half::nvfp4)
        for (float x : hs)
            if (x != hs[0]) throw std::invalid_argument("nvfp4's global scale is one per (layer, K|V)");
}

void quantize_slot(Half h, PageShape s, const float* row, uint8_t* page, int slot,
                   float tensor_scale) {
    quantize_slot(h, s, row, page, slot, std::vector<float>(size_t(std::max(s.n_kv_heads, 1)), tensor_scale));
}

void quantize_slot(Half h, PageShape s, const float* row, uint8_t* page, int slot,
                   const std::vector<float>& head_scales) {
    require(h, s);
    check_slot(s, slot);
    const int H = s.n_kv_heads, D = s.head_dim, n = H * D;
    uint8_t* dst = page + slot_byte_ranges(h, s, slot)[0].first;
    switch (h) {
        case Half::f32:
            for (int i = 0; i < n; ++i) put_f32(dst + 4 * i, row[i]);
            break;
        case Half::f16:
            for (int i = 0; i < n; ++i) put_u16(dst + 2 * i, to_f16(row[i]));
            break;
        case Half::bf16:
            for (int i = 0; i < n; ++i) put_u16(dst + 2 * i, to_bf16(row[i]));
            break;
        case Half::nvfp4: {
            check_head_scales(h, s, head_scales);
            const float tensor_scale = head_scales[0];
            uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int b = 0; b < n / 16; ++b) {
                uint8_t c[16];
                scales[b] = quantize_block_nvfp4(row + 16 * b, tensor_scale, c);
                for (int i = 0; i < 16; ++i) {
                    const int e = 16 * b + i;
                    dst[e / 2] = uint8_t(dst[e / 2] | (e % 2 == 0 ? c[i] : c[i] << 4));
                }
            }
            break;
        }
        case Half::fp8_e4m3:
        case Half::fp8_e5m2:
            check_head_scales(h, s, head_scales);
            for (int i = 0; i < n; ++i) {
                float y = row[i] / head_scales[size_t(i / D)];  // binary32, the element's head's scale
                dst[i] = h == Half::fp8_e4m3 ? to_e4m3(y) : to_e5m2(y);
            }
            break;
        case Half::fp8_per_token_head:
        case Half::int8_per_token_head: {
            uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int c = 0; c < H; ++c)
                put_f32(scales + 4 * c, quantize_cell_per_token_head(h, row + c * D, D, dst + c * D));
            break;
        }
        case Half::int8: {
            uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int c = 0; c < H; ++c) {
                uint16_t sc;
                quantize_cell_int8(row + c * D, D, reinterpret_cast<int8_t*>(dst + c * D), &sc);
                put_u16(scales + 2 * c, sc);
            }
            break;
        }
        case Half::q8_0:
            for (int b = 0; b < n / 32; ++b) quantize_block_q8_0(row + 32 * b, dst + kQ8Block * b);
            break;
        case Half::q4_0:
            for (int b = 0; b < n / 32; ++b) quantize_block_q4_0(row + 32 * b, dst + kQ4Block * b);
            break;
        case Half::q4_0_rot: {
            std::vector<float> rot(row, row + n);  // rotate each cell, then q4_0 over the row
            for (int c = 0; c < H; ++c) hadamard(rot.data() + c * D, D);
            for (int b = 0; b < n / 32; ++b) quantize_block_q4_0(rot.data() + 32 * b, dst + kQ4Block * b);
            break;
        }
        case Half::fp8_block128: {
            uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int b = 0; b < n / 128; ++b) put_f32(scales + 4 * b, quantize_tile_fp8_block128(row + 128 * b, dst + 128 * b));
            break;
        }
        case Half::mxfp8:
        case Half::mxfp4: {
            uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int b = 0; b < n / 32; ++b) {
                uint8_t c[32];
                scales[b] = quantize_block_mx(h, row + 32 * b, c);
                for (int i = 0; i < 32; ++i) {
                    const int e = 32 * b + i;
                    if (h == Half::mxfp8) dst[e] = c[i];
                    else dst[e / 2] = uint8_t(dst[e / 2] | (e % 2 == 0 ? c[i] : c[i] << 4));  // 2j low, 2j+1 high
                }
            }
            break;
        }
    }
}

void dequantize_slot(Half h, PageShape s, const uint8_t* page, int slot, float tensor_scale,
                     float* row) {
    dequantize_slot(h, s, page, slot, std::vector<float>(size_t(std::max(s.n_kv_heads, 1)), tensor_scale), row);
}

void dequantize_slot(Half h, PageShape s, const uint8_t* page, int slot, const std::vector<float>& head_scales,
                     float* row) {
    require(h, s);
    if (int(head_scales.size()) != s.n_kv_heads) throw std::invalid_argument("one scale per KV head expected");
    check_slot(s, slot);
    const int H = s.n_kv_heads, D = s.head_dim, n = H * D;
    const uint8_t* src = page + slot_byte_ranges(h, s, slot)[0].first;
    switch (h) {
        case Half::f32:
            for (int i = 0; i < n; ++i) row[i] = get_f32(src + 4 * i);
            break;
        case Half::f16:
            for (int i = 0; i < n; ++i) row[i] = from_f16(get_u16(src + 2 * i));
            break;
        case Half::bf16:
            for (int i = 0; i < n; ++i) row[i] = from_bf16(get_u16(src + 2 * i));
            break;
        case Half::fp8_e4m3:
            for (int i = 0; i < n; ++i) row[i] = from_e4m3(src[i]) * head_scales[size_t(i / D)];
            break;
        case Half::fp8_e5m2:
            for (int i = 0; i < n; ++i) row[i] = from_e5m2(src[i]) * head_scales[size_t(i / D)];
            break;
        case Half::int8: {
            const uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int c = 0; c < H; ++c) {
                float sc = from_f16(get_u16(scales + 2 * c));
                for (int i = 0; i < D; ++i) row[c * D + i] = float(int8_t(src[c * D + i])) * sc;
            }
            break;
        }
        case Half::q8_0:
            for (int b = 0; b < n / 32; ++b) dequantize_block_q8_0(src + kQ8Block * b, row + 32 * b);
            break;
        case Half::q4_0:
        case Half::q4_0_rot:
            for (int b = 0; b < n / 32; ++b) dequantize_block_q4_0(src + kQ4Block * b, row + 32 * b);
            if (h == Half::q4_0_rot)
                for (int c = 0; c < H; ++c) hadamard(row + c * D, D);  // self-inverse
            break;
        case Half::mxfp8:
        case Half::mxfp4: {
            const uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int e = 0; e < n; ++e) {
                const double X = from_e8m0(scales[e / 32]);
                const float v = h == Half::mxfp8 ? from_e4m3(src[e]) : from_e2m1(uint8_t(src[e / 2] >> (e % 2 ? 4 : 0)));
                row[e] = float(double(v) * X);  // exact: a power-of-two scale (binary32 range)
            }
            break;
        }
        case Half::fp8_per_token_head:
        case Half::int8_per_token_head: {
            const uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int c = 0; c < H; ++c) {
                const float sc = get_f32(scales + 4 * c);
                for (int i = 0; i < D; ++i) {
                    const uint8_t code = src[c * D + i];
                    row[c * D + i] = (h == Half::fp8_per_token_head ? from_e4m3(code) : float(int8_t(code))) * sc;
                }
            }
            break;
        }
        case Half::fp8_block128: {
            const uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int e = 0; e < n; ++e) row[e] = from_e4m3(src[e]) * get_f32(scales + 4 * (e / 128));
            break;
        }
        case Half::nvfp4: {
            const uint8_t* scales = page + slot_byte_ranges(h, s, slot)[1].first;
            for (int e = 0; e < n; ++e) {
                const float S = from_e4m3(scales[e / 16]) * head_scales[0];  // binary32, as stored (one global)
                row[e] = from_e2m1(uint8_t(src[e / 2] >> (e % 2 ? 4 : 0))) * S;
            }
            break;
        }
    }
}

// ---- pages -----------------------------------------------------------------------------------

static void check_tokens(PageShape s, int n_tokens) {
    if (n_tokens < 0 || n_tokens > s.block_size) throw std::out_of_range("n_tokens outside [0, block_size]");
}

std::vector<uint8_t> quantize_page(Half h, PageShape s, const float* x, int n_tokens,
                                   const std::vector<float>& head_scales) {
    std::vector<uint8_t> page(page_bytes(h, s), 0);
    check_tokens(s, n_tokens);
    const size_t row = size_t(s.n_kv_heads) * size_t(s.head_dim);
    for (int t = 0; t < n_tokens; ++t) quantize_slot(h, s, x + t * row, page.data(), t, head_scales);
    return page;
}

std::vector<float> dequantize_page(Half h, PageShape s, const uint8_t* page, int n_tokens,
                                   const std::vector<float>& head_scales) {
    require(h, s);
    check_tokens(s, n_tokens);
    const size_t row = size_t(s.n_kv_heads) * size_t(s.head_dim);
    std::vector<float> out(size_t(n_tokens) * row);
    for (int t = 0; t < n_tokens; ++t) dequantize_slot(h, s, page, t, head_scales, out.data() + t * row);
    return out;
}

std::vector<uint8_t> quantize_page(Half h, PageShape s, const float* x, int n_tokens,
                                   float tensor_scale) {
    return quantize_page(h, s, x, n_tokens, std::vector<float>(size_t(std::max(s.n_kv_heads, 1)), tensor_scale));
}

std::vector<float> dequantize_page(Half h, PageShape s, const uint8_t* page, int n_tokens,
                                   float tensor_scale) {
    return dequantize_page(h, s, page, n_tokens, std::vector<float>(size_t(std::max(s.n_kv_heads, 1)), tensor_scale));
}

float element_scale(Half h, PageShape s, const uint8_t* page, int slot, int head, int i,
                    float tensor_scale) {
    require(h, s);
    check_slot(s, slot);
    if (head < 0 || head >= s.n_kv_heads || i < 0 || i >= s.head_dim)
        throw std::out_of_range("element outside the cell");
    auto r = slot_byte_ranges(h, s, slot);
    switch (h) {
        case Half::f32:
        case Half::f16:
        case Half::bf16: return 0.0f;
        case Half::fp8_e4m3:
        case Half::fp8_e5m2: return tensor_scale;
        case Half::int8: return from_f16(get_u16(page + r[1].first + 2 * size_t(head)));
        case Half::fp8_per_token_head:
        case Half::int8_per_token_head: return get_f32(page + r[1].first + 4 * size_t(head));
        case Half::q8_0:
        case Half::q4_0:
        case Half::q4_0_rot: {
            size_t b = (size_t(head) * size_t(s.head_dim) + size_t(i)) / 32;  // block over the row
            size_t bb = h == Half::q8_0 ? kQ8Block : kQ4Block;
            return from_f16(get_u16(page + r[0].first + b * bb));
        }
        case Half::mxfp8:
        case Half::mxfp4:
            return float(from_e8m0(page[r[1].first + (size_t(head) * size_t(s.head_dim) + size_t(i)) / 32]));
        case Half::nvfp4:
            return from_e4m3(page[r[1].first + (size_t(head) * size_t(s.head_dim) + size_t(i)) / 16]) * tensor_scale;
        case Half::fp8_block128:
            return get_f32(page + r[1].first + 4 * ((size_t(head) * size_t(s.head_dim) + size_t(i)) / 128));
    }
    return 0.0f;
}

}  // namespace kvgate_oracle

// The chunked LM head and loss (ops::LmHeadLoss) at Gemma 3's 262,144-entry vocabulary: no
// [tokens, vocab] tensor exists at any T (the largest allocation is the same at 32 and 128 tokens,
// bounded by one chunk's fp32 logits or the [vocab, hidden] fp32 weight gradient, whichever is
// larger), and loss, d loss / d n and d loss / d W equal the exact (fp64) values within the bound
// the fp32 arithmetic allows, chunked or not.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>

#include "engine/model.h"
#include "engine/ops.h"
#include "tests/engine/largest_allocation.h"

namespace offloadd::engine {
namespace {

constexpr int64_t kGemma3Vocab = 262144;

struct HeadInputs {
  at::Tensor n, w, targets;
  double normalizer = 0;
};

// fp32 hidden states, head weight and targets, the first two tokens of each row ignored.
HeadInputs Inputs(int64_t rows, int64_t t, int64_t hidden, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  HeadInputs in;
  in.n = at::randn({rows, t, hidden}, gen);
  in.w = 0.5 * at::randn({vocab, hidden}, gen);
  in.targets = at::randint(vocab, {rows, t}, gen, at::kLong);
  in.targets.narrow(1, 0, 2).fill_(kIgnoreIndex);
  in.normalizer = static_cast<double>(rows * (t - 2));
  return in;
}

int64_t HeadLargestAllocation(const HeadInputs& in, int64_t chunk_bytes) {
  auto probe = std::make_shared<LargestAllocation>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, probe);
    at::Tensor dn, dw;
    at::Tensor loss = ops::LmHeadLoss(in.n, in.w, in.targets, in.normalizer, &dn, &dw, chunk_bytes);
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
  }
  return probe->largest;
}

// One chunk of 4 tokens is 4 MiB of fp32 logits; the weight gradient's fp32 accumulator is 8 MiB
// ([262144, 8]). At 128 tokens the logits alone would be 128 MiB.
TEST(LmHeadMemoryTest, LargestAllocationIndependentOfTokensTimesVocab) {
  const int64_t hidden = 8, chunk_bytes = 4 * kGemma3Vocab * 4;
  const int64_t at_32 = HeadLargestAllocation(Inputs(1, 32, hidden, kGemma3Vocab, 1), chunk_bytes);
  const int64_t at_128 = HeadLargestAllocation(Inputs(2, 64, hidden, kGemma3Vocab, 2), chunk_bytes);
  ASSERT_GT(at_32, 0) << "no allocation reported: the probe is not installed";
  EXPECT_EQ(at_32, at_128) << "the largest allocation grows with the tokens";
  EXPECT_LE(at_128, std::max(chunk_bytes, kGemma3Vocab * hidden * 4));
  EXPECT_LT(at_128, 128 * kGemma3Vocab * 4 / 8);
}

// The default chunk (ops::kHeadChunkBytes) at this vocabulary is 128 tokens: a 128K-token row is
// 1,024 chunks, each GEMM still [128, hidden] x [hidden, 262144].
TEST(LmHeadMemoryTest, DefaultChunkAt262kVocabularyIsWholeTokens) {
  EXPECT_EQ(ops::kHeadChunkBytes / (kGemma3Vocab * 4), 128);
}

double Gamma(double k) {
  const double u = std::ldexp(1.0, -24);
  return k * u / (1 - k * u);
}

struct Bounds {
  double loss = 0;
  at::Tensor dn, dw;
};

// First-order rounding bounds of LmHeadLoss in fp32 against exact arithmetic (fp64 here), with
// u = 2^-24 and gamma(k) = k u / (1 - k u) (Higham, ch. 3), per token t and vocabulary entry v:
//   logits z = n W^T:   |dz_tv| <= gamma(H) (|n| |W|^T)_tv;         Z_t = max_v of it
//   lse = m + log sum exp(z - m): |dlse_t| <= Z_t + u R_t + gamma(V + 4) + u (|lse_t| + |m_t|)
//                       (R_t = max_v |z_tv - m_t|: z - m's rounding inside exp; exp within 2 ulp)
//   CE_t = lse_t - z_t,y: |dCE_t| <= |dlse_t| + Z_t + u |CE_t|
//   loss = sum CE_t / N over any chunking: sum |dCE_t| / N + gamma(T) sum |CE_t| / N + 2u |loss|
//   p = exp(z - lse):   |dp_tv| <= p_tv (Z_t + |dlse_t| + u |z_tv - lse_t| + 4u)
//   G = (p - onehot) / N: |dG_tv| <= (|dp_tv| + u onehot_tv) / N + 2u |G_tv|
//   dn = G W:           |d dn| <= |dG| |W| + gamma(V) |G| |W|
//   dW = G^T n:         |d dW| <= |dG|^T |n| + gamma(T) |G|^T |n|  (chunks add partial GEMMs:
//                       still one summation of T products)
Bounds ExactAndBounds(const HeadInputs& in, at::Tensor* loss, at::Tensor* dn, at::Tensor* dw) {
  const double u = std::ldexp(1.0, -24);
  const int64_t hidden = in.n.size(-1), vocab = in.w.size(0);
  at::Tensor n = in.n.reshape({-1, hidden}).to(at::kDouble), w = in.w.to(at::kDouble);
  at::Tensor t = in.targets.reshape({-1});
  const int64_t tokens = n.size(0);
  at::Tensor mask = t.ne(kIgnoreIndex).to(at::kDouble);
  at::Tensor y = at::where(t.ne(kIgnoreIndex), t, at::zeros_like(t)).unsqueeze(1);
  at::Tensor z = n.mm(w.t());
  at::Tensor m = std::get<0>(z.max(1, true));
  at::Tensor lse = at::logsumexp(z, 1, true);
  at::Tensor ce = (lse - z.gather(1, y)).squeeze(1) * mask;
  *loss = ce.sum() / in.normalizer;
  at::Tensor p = (z - lse).exp();
  at::Tensor onehot = at::zeros_like(z).scatter_(1, y, 1.0);
  at::Tensor g = (p - onehot) * mask.unsqueeze(1) / in.normalizer;
  *dn = g.mm(w);
  *dw = g.t().mm(n);

  Bounds b;
  at::Tensor zt = Gamma(hidden) * std::get<0>(n.abs().mm(w.abs().t()).max(1, true));
  at::Tensor rt = std::get<0>((z - m).abs().max(1, true));
  at::Tensor dlse = zt + u * rt + Gamma(vocab + 4) + u * (lse.abs() + m.abs());
  at::Tensor dce = (dlse + zt + u * ce.abs().unsqueeze(1)).squeeze(1) * mask;
  b.loss =
      (dce.sum().item<double>() + Gamma(tokens) * ce.abs().sum().item<double>()) / in.normalizer +
      2 * u * std::abs(loss->item<double>());
  at::Tensor dp = p * (zt + dlse + u * (z - lse).abs() + 4 * u);
  at::Tensor dg = (dp + u * onehot) * mask.unsqueeze(1) / in.normalizer + 2 * u * g.abs();
  b.dn = dg.mm(w.abs()) + Gamma(vocab) * g.abs().mm(w.abs());
  b.dw = dg.t().mm(n.abs()) + Gamma(tokens) * g.abs().t().mm(n.abs());
  return b;
}

// Largest |fp32 - exact| / bound over the elements (<= 1 within the bound).
double Ratio(const at::Tensor& got, const at::Tensor& exact, const at::Tensor& bound) {
  at::Tensor d = (got.to(at::kDouble).reshape(exact.sizes()) - exact).abs();
  return (d / bound.clamp_min(1e-300)).max().item<double>();
}

void ExpectWithinBounds(int64_t vocab, int64_t rows, int64_t t, int64_t chunk_tokens) {
  const HeadInputs in = Inputs(rows, t, 32, vocab, 7);
  at::Tensor loss64, dn64, dw64;
  const Bounds b = ExactAndBounds(in, &loss64, &dn64, &dw64);
  for (int64_t chunk : {chunk_tokens, rows * t}) {  // chunked, and one chunk for all
    at::Tensor dn, dw;
    at::Tensor loss =
        ops::LmHeadLoss(in.n, in.w, in.targets, in.normalizer, &dn, &dw, chunk * vocab * 4);
    const double loss_err = std::abs(loss.item<double>() - loss64.item<double>());
    EXPECT_LE(loss_err, b.loss) << "chunk of " << chunk << " tokens";
    const double rn = Ratio(dn, dn64, b.dn), rw = Ratio(dw, dw64, b.dw);
    EXPECT_LE(rn, 1.0) << "dn, chunk of " << chunk << " tokens";
    EXPECT_LE(rw, 1.0) << "dW, chunk of " << chunk << " tokens";
    // A chunk that dropped, repeated or misplaced tokens would be off by O(1), not O(u).
    std::printf(
        "vocab %lld, chunk %lld tokens: loss error %.3g (bound %.3g), dn %.3g and dW %.3g "
        "of their bounds\n",
        static_cast<long long>(vocab), static_cast<long long>(chunk), loss_err, b.loss, rn, rw);
  }
}

TEST(LmHeadLossTest, ChunkedEqualsExactWithinFp32Bound) { ExpectWithinBounds(1000, 2, 19, 3); }

TEST(LmHeadLossTest, ChunkedEqualsExactWithinFp32BoundAt262kVocabulary) {
  ExpectWithinBounds(kGemma3Vocab, 1, 9, 4);
}

}  // namespace
}  // namespace offloadd::engine

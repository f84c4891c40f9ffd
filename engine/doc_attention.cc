#include "engine/doc_attention.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "engine/ops.h"

namespace offloadd::engine::ops {
namespace {

Documents Finish(std::vector<int64_t> offsets, int64_t seq, c10::Device device) {
  Documents docs;
  docs.seq = seq;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    docs.max_len = std::max(docs.max_len, offsets[i + 1] - offsets[i]);
  }
  TORCH_CHECK(offsets.back() <= std::numeric_limits<int32_t>::max(), "attention: ", offsets.back(),
              " tokens in one micro-batch exceed int32 offsets");
  docs.cu_seqlens = at::tensor(offsets, at::kLong).to(at::kInt).to(device);
  docs.offsets = std::move(offsets);
  return docs;
}

// [Hkv, K, D] -> [Hkv * rep, K, D], transformers' repeat_kv for one row.
at::Tensor RepeatHeads(const at::Tensor& x, int64_t rep) {
  if (rep == 1) return x;
  const int64_t h = x.size(0), n = x.size(1), d = x.size(2);
  return x.unsqueeze(1).expand({h, rep, n, d}).reshape({h * rep, n, d});
}

// [Hkv * rep, K, D] -> [Hkv, K, D], summing each group's heads (fp32 in, fp32 out).
at::Tensor ReduceHeads(const at::Tensor& x, int64_t rep) {
  if (rep == 1) return x;
  return x.view({x.size(0) / rep, rep, x.size(1), x.size(2)}).sum(1);
}

// One query tile of one document: queries [q0, q1) and keys [k0, q1) of row `row` (positions
// within the row).
struct Tile {
  int64_t row, q0, q1, k0;
};

template <class F>
void ForEachTile(const Documents& docs, int64_t heads, int64_t window, F&& f) {
  for (size_t i = 0; i + 1 < docs.offsets.size(); ++i) {
    const int64_t start = docs.offsets[i], len = docs.offsets[i + 1] - start;
    const int64_t row = start / docs.seq, base = start % docs.seq;
    const int64_t keys = window > 0 ? std::min(len, window + 512) : len;
    const int64_t qt = QueryTile(heads, keys);
    for (int64_t a = 0; a < len; a += qt) {
      const int64_t b = std::min(a + qt, len);
      const int64_t k0 = window > 0 ? std::max<int64_t>(0, a - window + 1) : 0;
      f(Tile{row, base + a, base + b, base + k0});
    }
  }
}

// The tile's probabilities in the compute dtype, as transformers' eager attention computes them:
// scaled logits in the dtype (soft-capped: / cap, tanh, * cap), the causal/window mask, softmax
// in fp32, cast back. `capped_tanh` receives tanh(logits / cap) when soft-capping. With `sinks`
// ([H], gpt-oss) each head's sink logit joins every query's softmax as one more column, after the
// row maximum is subtracted (GptOss's eager_attention_forward); the result then has K + 1 columns,
// the last one the sink's probability (which attends to nothing).
at::Tensor TileProbs(const at::Tensor& qt, const at::Tensor& kt, const Tile& t, double scale,
                     int64_t window, double softcap, at::Tensor* capped_tanh,
                     const at::Tensor& sinks = at::Tensor()) {
  at::Tensor s = at::matmul(qt, kt.transpose(1, 2)) * scale;
  if (softcap > 0) {
    at::Tensor th = at::tanh(s / softcap);
    s = th * softcap;
    if (capped_tanh) *capped_tanh = th;
  }
  const auto idx = at::TensorOptions().dtype(at::kLong).device(qt.device());
  at::Tensor qi = at::arange(t.q0, t.q1, idx).unsqueeze(1);
  at::Tensor kj = at::arange(t.k0, t.q1, idx).unsqueeze(0);
  at::Tensor hidden = kj > qi;  // [Q, K]
  if (window > 0) hidden = hidden | ((qi - kj) >= window);
  s = s.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  if (sinks.defined()) {
    at::Tensor sink = sinks.to(s.scalar_type()).view({-1, 1, 1}).expand({s.size(0), s.size(1), 1});
    s = at::cat({s, sink}, -1);
    s = s - std::get<0>(s.max(-1, /*keepdim=*/true));
  }
  return at::softmax(s, -1, at::kFloat).to(qt.scalar_type());
}

at::Tensor Slice(const at::Tensor& x, int64_t row, int64_t from, int64_t to) {
  return x.select(0, row).narrow(1, from, to - from);
}

// FlashAttention's packed layout: [B, H, T, D] -> [B * T, H, D].
at::Tensor Flat(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0) * x.size(2), x.size(1), x.size(3)});
}
at::Tensor Unflat(const at::Tensor& x, int64_t batch) {
  return x.view({batch, x.size(0) / batch, x.size(1), x.size(2)}).transpose(1, 2);
}

std::optional<int64_t> Left(int64_t window) {
  return window > 0 ? std::optional<int64_t>(window - 1) : std::nullopt;
}
std::optional<int64_t> Right(int64_t window) {
  return window > 0 ? std::optional<int64_t>(0) : std::nullopt;
}

void CheckShapes(const at::Tensor& q, const at::Tensor& k, const Documents& docs) {
  TORCH_CHECK(
      docs.defined() && docs.seq == q.size(2) && docs.offsets.back() == q.size(0) * q.size(2),
      "attention: the documents do not cover the micro-batch [", q.size(0), ", ", q.size(2), "]");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "attention: ", q.size(1), " query heads for ", k.size(1),
              " key/value heads");
}

}  // namespace

Documents DocumentsOf(const at::Tensor& segment_ids, c10::Device device) {
  TORCH_CHECK(segment_ids.dim() == 2, "segment_ids must be [batch, seq]");
  const at::Tensor ids = segment_ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t b = ids.size(0), t = ids.size(1);
  const int64_t* p = ids.data_ptr<int64_t>();
  std::vector<int64_t> offsets{0};
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t i = 1; i < t; ++i) {
      if (p[r * t + i] != p[r * t + i - 1]) offsets.push_back(r * t + i);
    }
    offsets.push_back((r + 1) * t);
  }
  return Finish(std::move(offsets), t, device);
}

Documents RowDocuments(int64_t batch, int64_t seq, c10::Device device) {
  std::vector<int64_t> offsets(batch + 1);
  for (int64_t r = 0; r <= batch; ++r) offsets[r] = r * seq;
  return Finish(std::move(offsets), seq, device);
}

bool VarlenFlashFits(c10::Device device, c10::ScalarType dtype, int64_t head_dim, double softcap) {
  return softcap <= 0 && WindowedFlashFits(device, dtype, head_dim);
}

at::Tensor DocumentAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale, const Documents& docs, int64_t window, double softcap,
                             std::vector<at::Tensor>* aux, const at::Tensor& sinks) {
  CheckShapes(q, k, docs);
  if (!sinks.defined() && VarlenFlashFits(q.device(), q.scalar_type(), q.size(3), softcap)) {
    // Grouped-query heads go in as they are: the kernel maps query heads onto key/value heads.
    auto r = at::_flash_attention_forward(
        Flat(q), Flat(k), Flat(v), docs.cu_seqlens, docs.cu_seqlens, docs.max_len, docs.max_len,
        /*dropout_p=*/0.0, /*is_causal=*/true,
        /*return_debug_mask=*/false, scale, Left(window), Right(window));
    if (aux) aux->insert(aux->end(), {std::get<1>(r), std::get<2>(r), std::get<3>(r)});
    return Unflat(std::get<0>(r), q.size(0));
  }
  const int64_t heads = q.size(1), rep = heads / k.size(1);
  at::Tensor out = at::empty(q.sizes(), q.options());
  ForEachTile(docs, heads, window, [&](const Tile& t) {
    at::Tensor kt = RepeatHeads(Slice(k, t.row, t.k0, t.q1), rep);
    at::Tensor vt = RepeatHeads(Slice(v, t.row, t.k0, t.q1), rep);
    at::Tensor p =
        TileProbs(Slice(q, t.row, t.q0, t.q1), kt, t, scale, window, softcap, nullptr, sinks);
    if (sinks.defined()) p = p.narrow(-1, 0, vt.size(1));  // the sink attends to nothing
    Slice(out, t.row, t.q0, t.q1).copy_(at::matmul(p, vt));
  });
  return out;
}

void DocumentAttentionBackward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& out, const at::Tensor* aux,
                               double scale, const Documents& docs, int64_t window, double softcap,
                               at::Tensor* dq, at::Tensor* dk, at::Tensor* dv,
                               const at::Tensor& sinks, at::Tensor* dsinks) {
  CheckShapes(q, k, docs);
  if (!sinks.defined() && VarlenFlashFits(q.device(), q.scalar_type(), q.size(3), softcap)) {
    auto [gq, gk, gv] = at::_flash_attention_backward(
        Flat(dout).contiguous(), Flat(q), Flat(k), Flat(v), Flat(out), aux[0], docs.cu_seqlens,
        docs.cu_seqlens, docs.max_len, docs.max_len, /*dropout_p=*/0.0, /*is_causal=*/true, aux[1],
        aux[2], scale, Left(window), Right(window));
    const int64_t b = q.size(0);
    *dq = Unflat(gq, b);
    *dk = Unflat(gk, b);
    *dv = Unflat(gv, b);
    return;
  }
  // transformers' eager backward per tile: dV = P^T dO, dP = dO V^T, dS = softmax_backward(dP, P)
  // in fp32 cast back, (through the soft-cap,) * scale; dQ = dS K, dK = dS^T Q. d K and d V sum
  // over every tile of their document, so they are accumulated in fp32 and rounded once.
  const int64_t heads = q.size(1), rep = heads / k.size(1);
  const c10::ScalarType dtype = q.scalar_type();
  *dq = at::zeros(q.sizes(), q.options());
  at::Tensor gk = at::zeros(k.sizes(), k.options().dtype(at::kFloat));
  at::Tensor gv = at::zeros(v.sizes(), v.options().dtype(at::kFloat));
  // d sink = sum over queries of the sink column's d logit (fp32, rounded once).
  at::Tensor gs =
      sinks.defined() ? at::zeros({heads}, sinks.options().dtype(at::kFloat)) : at::Tensor();
  ForEachTile(docs, heads, window, [&](const Tile& t) {
    at::Tensor qt = Slice(q, t.row, t.q0, t.q1), dot = Slice(dout, t.row, t.q0, t.q1);
    at::Tensor kt = RepeatHeads(Slice(k, t.row, t.k0, t.q1), rep);
    at::Tensor vt = RepeatHeads(Slice(v, t.row, t.k0, t.q1), rep);
    at::Tensor capped_tanh;
    at::Tensor p_all = TileProbs(qt, kt, t, scale, window, softcap, &capped_tanh, sinks);
    const int64_t keys = kt.size(1);
    at::Tensor p = sinks.defined() ? p_all.narrow(-1, 0, keys) : p_all;
    Slice(gv, t.row, t.k0, t.q1)
        .add_(ReduceHeads(at::matmul(p.transpose(1, 2).to(at::kFloat), dot.to(at::kFloat)), rep));
    at::Tensor dp = at::matmul(dot, vt.transpose(1, 2));
    if (sinks.defined()) dp = at::constant_pad_nd(dp, {0, 1});  // the sink column's d prob: 0
    at::Tensor ds =
        at::_softmax_backward_data(dp.to(at::kFloat), p_all.to(at::kFloat), -1, at::kFloat);
    if (sinks.defined()) {
      gs.add_(ds.select(-1, keys).sum(-1));
      ds = ds.narrow(-1, 0, keys);
    }
    ds = ds.to(dtype);
    dp = p = p_all = at::Tensor();
    if (softcap > 0) ds = at::tanh_backward(ds * softcap, capped_tanh) / softcap;
    ds = ds * scale;
    Slice(*dq, t.row, t.q0, t.q1).copy_(at::matmul(ds, kt));
    Slice(gk, t.row, t.k0, t.q1)
        .add_(ReduceHeads(at::matmul(ds.transpose(1, 2).to(at::kFloat), qt.to(at::kFloat)), rep));
  });
  *dk = gk.to(dtype);
  *dv = gv.to(dtype);
  if (dsinks) *dsinks = gs.defined() ? gs.to(sinks.scalar_type()) : at::Tensor();
}

}  // namespace offloadd::engine::ops

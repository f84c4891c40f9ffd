// The weighted dataset mixture (text/mixture.h): its documented rule, proportions, exhaustion,
// determinism and resuming through the Batcher. tests/python/trainer/test_dataset_mixture.py
// checks a job's batches against a Python reimplementation of the same rule.

#include "text/mixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "text/batcher.h"

namespace offloadd::text {
namespace {

Mixture Make(std::vector<uint64_t> sizes, std::vector<double> weights, uint64_t seed,
             MixtureStopping stopping = MixtureStopping::kFirstExhausted, bool shuffle = true) {
  MixtureOptions o;
  o.sizes = std::move(sizes);
  o.weights = std::move(weights);
  o.seed = seed;
  o.stopping = stopping;
  o.shuffle = shuffle;
  auto m = Mixture::Create(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// Values of tests/python/trainer/mixture_rule.py, which implements the header's description.
TEST(Mixture, FollowsTheDocumentedRule) {
  const Mixture m = Make({3, 2}, {3, 1}, 42);
  EXPECT_EQ(m.EpochOrder(0), (std::vector<uint32_t>{2, 1, 0}));
  EXPECT_EQ(m.EpochOrder(1), (std::vector<uint32_t>{0, 1, 4, 2}));
  EXPECT_EQ(Make({3, 2}, {3, 1}, 42, MixtureStopping::kAllExhausted).EpochOrder(0),
            (std::vector<uint32_t>{2, 1, 0, 2, 1, 0, 2, 1, 0, 2, 1, 4, 0, 3}));
  EXPECT_EQ(Make({4, 3}, {1, 1}, 7, MixtureStopping::kAllExhausted, false).EpochOrder(0),
            (std::vector<uint32_t>{0, 1, 2, 4, 5, 6, 3}));
  EXPECT_EQ(m.offsets(), (std::vector<uint64_t>{0, 3}));
  EXPECT_EQ(m.total(), 5u);
}

// Each draw picks dataset 0 with probability p = 3/4, independently: over N draws the count is
// Binomial(N, p), so |count - N p| <= 5 sqrt(N p (1 - p)) for any seed but with probability
// about 6e-7 (the normal tail beyond 5 sigma); 20 seeds stay below 2e-5 in all.
TEST(Mixture, DrawsInProportionToTheWeights) {
  const double p = 0.75;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const Mixture m = Make({30000, 10000}, {3, 1}, seed);
    const std::vector<uint32_t> order = m.EpochOrder(0);
    const double n = static_cast<double>(order.size());
    ASSERT_GT(n, 30000);  // first_exhausted: about 40000 draws
    double first = 0;
    for (uint32_t d : order) first += d < 30000;
    EXPECT_LE(std::abs(first - n * p), 5 * std::sqrt(n * p * (1 - p))) << "seed " << seed;
  }
  // Weights act by their ratio only.
  EXPECT_EQ(Make({50, 20}, {0.3, 0.1}, 3).EpochOrder(2), Make({50, 20}, {3, 1}, 3).EpochOrder(2));
}

TEST(Mixture, DeterministicBySeedAndEpoch) {
  const Mixture a = Make({100, 40, 7}, {2, 1, 0.5}, 11);
  EXPECT_EQ(a.EpochOrder(0), Make({100, 40, 7}, {2, 1, 0.5}, 11).EpochOrder(0));
  EXPECT_EQ(a.EpochOrder(3), a.EpochOrder(3));
  EXPECT_NE(a.EpochOrder(0), a.EpochOrder(1));
  EXPECT_NE(a.EpochOrder(0), Make({100, 40, 7}, {2, 1, 0.5}, 12).EpochOrder(0));
}

// first_exhausted: the epoch ends with the last document of the first dataset to run out, and
// no document is seen twice. all_exhausted: every document of every dataset is seen, smaller
// datasets again in a new order, and the epoch ends when the last one runs out.
TEST(Mixture, ExhaustionRules) {
  const std::vector<uint64_t> sizes = {40, 10};
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const std::vector<uint32_t> first = Make(sizes, {1, 1}, seed).EpochOrder(0);
    std::set<uint32_t> seen(first.begin(), first.end());
    EXPECT_EQ(seen.size(), first.size()) << "a document twice in one epoch, seed " << seed;
    const size_t ran_out = first.back() < 40 ? 0 : 1;
    size_t of_it = 0;
    for (uint32_t d : first) of_it += (d < 40 ? 0u : 1u) == ran_out;
    EXPECT_EQ(of_it, sizes[ran_out]) << seed;  // the last one completed its dataset
    EXPECT_LT(first.size(), 50u) << seed;      // the other was cut short

    const std::vector<uint32_t> all =
        Make(sizes, {1, 1}, seed, MixtureStopping::kAllExhausted).EpochOrder(0);
    EXPECT_EQ(std::set<uint32_t>(all.begin(), all.end()).size(), 50u) << seed;
    size_t big = 0;
    for (uint32_t d : all) big += d < 40;
    EXPECT_EQ(all.back() < 40, true) << seed;  // 40 documents at 1:1 run out last
    EXPECT_EQ(big, 40u) << seed;               // each seen once, ending with its last
    EXPECT_GT(all.size() - big, 10u) << seed;  // the small one was seen again
  }
}

TEST(Mixture, RefusesBadWeightsAndEmptyMixtures) {
  auto create = [](std::vector<uint64_t> sizes, std::vector<double> weights) {
    MixtureOptions o;
    o.sizes = std::move(sizes);
    o.weights = std::move(weights);
    return Mixture::Create(o).status();
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double w : {0.0, -1.0, nan, inf}) {
    const Status s = create({5, 5}, {1, w});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << w;
    EXPECT_NE(s.message().find("datasets[1].weight"), std::string::npos) << s.message();
  }
  EXPECT_NE(create({}, {}).message().find("an empty mixture"), std::string_view::npos);
  EXPECT_NE(create({5, 0}, {1, 1}).message().find("datasets[1]: no documents"),
            std::string_view::npos);
  EXPECT_NE(create({5, 5}, {1e308, 1e308}).message().find("not finite"), std::string_view::npos);
  // An all_exhausted epoch that would hold about 10^9 documents.
  MixtureOptions o;
  o.sizes = {1000, 1000};
  o.weights = {1, 1e-6};
  o.stopping = MixtureStopping::kAllExhausted;
  EXPECT_NE(Mixture::Create(o).status().message().find("first_exhausted"), std::string_view::npos);
  o.stopping = MixtureStopping::kFirstExhausted;  // draws each document once at most: accepted
  ASSERT_TRUE(Mixture::Create(o).ok());
  EXPECT_LE(Mixture::Create(o)->EpochOrder(0).size(), 2000u);
  EXPECT_EQ(ParseMixtureStopping("all_exhausted").value(), MixtureStopping::kAllExhausted);
  EXPECT_FALSE(ParseMixtureStopping("all_exhausted_without_replacement").ok());
}

std::shared_ptr<std::vector<Document>> Docs(size_t n) {
  auto docs = std::make_shared<std::vector<Document>>();
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i + 1);
    docs->push_back(Document{{id, id, id}, {id, id, id}});
  }
  return docs;
}

// The Batcher packs the mixture's order; a cursor saved anywhere, across epoch boundaries,
// continues the same sequence, and one saved for another mixture is refused.
TEST(Mixture, BatcherFollowsTheOrderAndResumesExactly) {
  BatcherOptions o;
  o.max_seq_length = 7;  // two 3-token documents per sequence
  o.seed = 9;
  o.mixture = std::make_shared<Mixture>(Make({12, 5}, {3, 1}, 9));
  auto docs = Docs(17);
  auto b = Batcher::Create(docs, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::vector<uint64_t> sources;
  std::vector<PackedSequence> seqs;
  std::vector<std::string> states;
  for (int i = 0; i < 40; ++i) {
    states.push_back(b->SaveState());
    seqs.push_back(b->Next());
    sources.insert(sources.end(), seqs.back().sources.begin(), seqs.back().sources.end());
  }
  std::vector<uint64_t> want;
  for (uint64_t e = 0; want.size() < sources.size(); ++e) {
    for (uint32_t d : o.mixture->EpochOrder(e)) want.push_back(d);
  }
  // Every document fits, so the documents packed are the epochs' orders one after the other.
  want.resize(sources.size());
  EXPECT_EQ(sources, want);
  for (int at : {1, 7, 23, 39}) {
    auto c = Batcher::Create(docs, o);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->RestoreState(states[at]).ok()) << states[at];
    for (int i = at; i < 40; ++i) EXPECT_EQ(c->Next().sources, seqs[i].sources) << at << " " << i;
  }
  BatcherOptions other = o;
  other.mixture = std::make_shared<Mixture>(Make({12, 5}, {1, 1}, 9));
  auto d = Batcher::Create(docs, other);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->RestoreState(states[3]).code(), StatusCode::kFailedPrecondition);
  BatcherOptions plain = o;
  plain.mixture.reset();
  auto p = Batcher::Create(docs, plain);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->RestoreState(states[3]).code(), StatusCode::kFailedPrecondition);
  BatcherOptions wrong = o;
  wrong.mixture = std::make_shared<Mixture>(Make({12, 4}, {3, 1}, 9));
  EXPECT_FALSE(Batcher::Create(docs, wrong).ok());  // 16 documents in the mixture, 17 given
}

}  // namespace
}  // namespace offloadd::text

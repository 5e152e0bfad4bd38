"""The attacker suite (issue 30): no attacker's capacity depends on the width of the table it judges, the strongest
member is what every figure quotes, re-identification links people across actions, and the trivial baselines are
label-free projections of the published width."""
import numpy as np
import pytest
import torch

from splavu_core.evaluation import attackers as A
from splavu_core.evaluation import protocols as P
from splavu_core.evaluation import trivial
from splavu_core.store import ledger
from splavu_core.tasks.features import VideoFeatures
from splavu_core.tasks.metrics import cmap

D = 24


def _videos(n, split, rng, attr_dims=3, subject_signal=0.0, n_subjects=10, nonlinear=True):
    """Videos of 2 clips; three attributes written NON-linearly (a product of two coordinates' signs) into the
    first dims, so a wide attacker reads them where a narrow or linear one struggles; the rest is noise."""
    out = []
    actions = ("walk", "jump", "clap")
    for i in range(n):
        subj = i % n_subjects
        a = rng.integers(0, 2, attr_dims)
        base = rng.standard_normal(D)
        for j in range(attr_dims):
            s = 1.0 if a[j] else -1.0
            if nonlinear:  # attribute = sign(x_2j) * sign(x_2j+1): XOR-like, invisible to a linear probe
                base[2 * j] = abs(base[2 * j]) + 0.5
                base[2 * j + 1] = s * (abs(base[2 * j + 1]) + 0.5)
                if rng.random() < 0.5:
                    base[2 * j] *= -1
                    base[2 * j + 1] *= -1
            else:
                base[j] += 2.0 * s
        base[attr_dims * 2:attr_dims * 2 + 4] += subject_signal * np.random.default_rng(subj).standard_normal(4)
        feats = np.stack([base + 0.1 * rng.standard_normal(D) for _ in range(2)]).astype(np.float32)
        out.append(VideoFeatures(f"{split}{i:03d}", split, feats, np.array([0.0, 1.0]), np.array([1.0, 2.0]), 32,
                                 16.0, meta={"action": actions[i % 3], "subject_id": f"{split}_{subj}",
                                             **{f"attr_{k}": int(a[k]) for k in range(attr_dims)}}))
    return out


def _project(videos, q):
    return [VideoFeatures(v.video_id, v.split, (v.feats @ q).astype(np.float32), v.clip_start_s, v.clip_end_s,
                          v.n_frames, v.fps, dict(v.meta)) for v in videos]


def test_no_suite_attacker_shrinks_with_the_table():
    for name in A.SUITE_NAMES:
        assert A.capacity(name, 4) == A.capacity(name, 14) == A.capacity(name, 192), name
    assert A.capacity("mlp", 4)["hidden"] == A.HIDDEN >= 192           # no smaller than the raw encoder's width
    assert A.capacity("mlp_width", 14)["hidden"] == 14                 # the previous protocol's: it shrinks ...
    assert "mlp_width" not in A.SUITE_NAMES                            # ... so it never judges


def test_strongest_is_the_best_suite_member_never_the_reference():
    assert A.strongest({"mlp": 0.7, "linear": 0.8, "gbdt": 0.75, "knn": 0.6, "mlp_width": 0.95}) == "linear"
    assert A.strongest({"mlp": 0.7, "knn": 0.7}) == "mlp"              # ties: the earlier member
    with pytest.raises(AssertionError):
        A.strongest({"mlp_width": 0.9})


def _reference_mlp(train, test, attrs, seed=0, epochs=60):
    """An independent fixed 512-wide MLP (plain nn.Sequential, standardised), best test epoch."""
    d = P.attack_data(train, test, attrs)
    x, xt = A.standardise(d.x, d.xt)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 512), torch.nn.ReLU(), torch.nn.Linear(512, len(attrs)))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    X, Y, XT = torch.from_numpy(x), torch.from_numpy(d.y), torch.from_numpy(xt)
    best = 0.0
    for _ in range(epochs):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(X), Y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            best = max(best, cmap(d.y_test, d.video_mean(torch.sigmoid(net(XT)).numpy())))
    return best


@pytest.mark.parametrize("k", [4, 8, 14])
def test_suite_finds_as_much_as_a_fixed_512_mlp_on_same_width_pca_tables(k):
    rng = np.random.default_rng(k)
    train, test = _videos(300, "train", rng), _videos(150, "test", rng)
    clips = np.concatenate([v.feats for v in train])
    mu, q = trivial.fit(clips, k)["pca_%d" % k]
    tr, te = _project(train, q), _project(test, q)
    attrs = ["0", "1", "2"]
    sc = P.privacy_attack(tr, te, attrs, seeds=[0], epochs=60)
    suite_best = sc.metrics["cmap"](0, None)
    ref = _reference_mlp(tr, te, attrs)
    assert suite_best >= ref - 0.02, (k, sc.details["attacker_cmap"], ref)
    assert sc.details["capacity"]["mlp"] == {"hidden": 512}
    assert sc.details["strongest"] in A.SUITE_NAMES


def test_reidentification_links_people_across_actions_not_actions():
    rng = np.random.default_rng(0)
    train, test = _videos(120, "train", rng, subject_signal=3.0), _videos(90, "test", rng, subject_signal=3.0)
    sc = P.reidentification(train, test)
    r1 = sc.metrics["rank1"](0, None)
    assert r1 > 0.8 and sc.chance["rank1"] < 0.2                       # the subject signal links them
    # chance is the share of same-subject videos among each query's gallery (other actions only)
    subj = np.array([v.meta["subject_id"] for v in test])
    act = np.array([v.meta["action"] for v in test])
    shares = [((subj == subj[i]) & (act != act[i])).sum() / (act != act[i]).sum() for i in range(len(test))]
    assert sc.chance["rank1"] == pytest.approx(np.mean(shares))
    # features that carry the action and nothing of the person: linking falls to chance, although the same
    # action would have been trivial to match (those videos are never in the gallery)
    onehot = {"walk": 0, "jump": 1, "clap": 2}
    blind = [VideoFeatures(v.video_id, v.split, np.tile(np.eye(3)[onehot[v.meta["action"]]] * 5
                                                        + 0.01 * rng.standard_normal(3), (2, 1)).astype(np.float32),
                           v.clip_start_s, v.clip_end_s, v.n_frames, v.fps, dict(v.meta)) for v in train + test]
    sb = P.reidentification(blind[:len(train)], blind[len(train):])
    assert sb.metrics["rank1"](0, None) < sc.chance["rank1"] + 0.15
    assert set(sc.details["attacker_rank1"]) == {"cosine", "lda"}


def test_trivial_baselines_are_orthonormal_projections_of_the_published_width():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((500, D)) * np.r_[np.full(3, 10.0), np.ones(D - 3)]
    fitted = trivial.fit(x, 3)
    assert set(fitted) == {"pca_3", "randproj_3"}
    for mu, q in fitted.values():
        assert q.shape == (D, 3) and np.allclose(q.T @ q, np.eye(3), atol=1e-8)
    _, q = fitted["pca_3"]
    assert np.allclose(np.linalg.norm(q[:3], axis=0), 1, atol=0.01)  # spans the 3 high-variance axes
    with pytest.raises(AssertionError):
        trivial.fit(x, D)                                           # k = D would be the raw latents


def test_privacy_gate_binds_on_reidentification_too():
    ok_part = {"leakage_removed": 0.7, "leakage_removed_ci_low": 0.6, "anonymized_cmap": 0.6, "chance_cmap": 0.5}
    linking = {"leakage_removed": 0.3, "leakage_removed_ci_low": 0.1, "anonymized_cmap": 0.3, "chance_cmap": 0.05,
               "metric": "rank1", "strongest_anonymized": "lda"}
    ok, why = ledger.budget_verdict({"closeups": ok_part, "clips": ok_part, "linking": linking}, 0.5)
    assert not ok and "linking: linkage removed 0.300" in why and "lda" in why
    ok, why = ledger.budget_verdict({"closeups": ok_part, "clips": ok_part, "linking": {"skipped": "no subject_id"}},
                                    0.5)
    assert ok and "re-identification not measured (no subject_id)" in why

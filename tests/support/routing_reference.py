"""Slow, loop-by-loop references of Algorithms 1 and 2 of Dou et al. (2019).

Written straight from the paper for one position at a time, in float64, with
no vectorisation, to check the modules against.
"""

import math

import torch


def reference_votes(agg, layers_at_position):
    """Input capsules (Eq. 9) and votes (Eq. 8) for one position; layers: list of (d,)."""
    num_layers, d = len(layers_at_position), layers_at_position[0].numel()
    n_caps, h = agg.output_capsules, agg.capsule_dim
    if agg.capsule_input == "all" and agg.capsule_rank > 0:
        shared = agg.capsule_bottleneck.weight.double() @ torch.cat(layers_at_position)
        capsules = [agg.input_capsule_weight[l].double() @ shared + agg.input_capsule_bias[l].double()
                    for l in range(num_layers)]
    elif agg.capsule_input == "all":
        concat = torch.cat(layers_at_position)
        w = agg.input_capsules.weight.double().view(num_layers, d, num_layers * d)
        b = agg.input_capsules.bias.double().view(num_layers, d)
        capsules = [w[l] @ concat + b[l] for l in range(num_layers)]
    else:
        capsules = [agg.input_capsule_weight[l].double() @ layers_at_position[l]
                    + agg.input_capsule_bias[l].double() for l in range(num_layers)]
    votes = [[None] * n_caps for _ in range(num_layers)]
    for l in range(num_layers):
        for n in range(n_caps):
            w_ln = agg.vote_weight[l].double()[n * h:(n + 1) * h]  # W_{l->n} in R^{(d/N) x d}
            votes[l][n] = w_ln @ capsules[l]
    return capsules, votes


def squash(s):
    norm = s.norm()
    return (norm ** 2 / (1 + norm ** 2)) * s / norm


def dynamic_routing(votes, iters, softmax_over="output"):
    """Algorithm 1: returns (output capsules, list of C per iteration).

    ``softmax_over='input'``: Eq. 10 normalised over the input capsules l instead of the output capsules n.
    """
    num_layers, n_caps = len(votes), len(votes[0])
    logits = [[0.0] * n_caps for _ in range(num_layers)]
    history = []
    for _ in range(iters):
        if softmax_over == "output":
            c = [[math.exp(logits[l][n]) / sum(math.exp(x) for x in logits[l]) for n in range(n_caps)]
                 for l in range(num_layers)]
        else:
            c = [[math.exp(logits[l][n]) / sum(math.exp(logits[k][n]) for k in range(num_layers))
                  for n in range(n_caps)] for l in range(num_layers)]
        history.append(c)
        omega = []
        for n in range(n_caps):
            s = sum(c[l][n] * votes[l][n] for l in range(num_layers))
            omega.append(squash(s))
        for l in range(num_layers):
            for n in range(n_caps):
                logits[l][n] += float(omega[n] @ votes[l][n])
    return omega, history


def em_routing(votes, input_act, beta_a, beta_mu, iters, inverse_temperature, var_floor):
    """Algorithm 2 with the module's documented choices (lambda_t = lambda t / T,
    variance floor): returns (output capsules, list of C per iteration, A^Omega)."""
    num_layers, n_caps = len(votes), len(votes[0])
    h = votes[0][0].numel()
    c = [[1.0 / n_caps] * n_caps for _ in range(num_layers)]
    history = []
    for step in range(iters):
        history.append([row[:] for row in c])
        lam = inverse_temperature * (step + 1) / iters
        mus, sigmas2, acts = [], [], []
        for n in range(n_caps):
            r = [c[l][n] * input_act[l] for l in range(num_layers)]
            r_sum = sum(r)
            mu = sum(r[l] * votes[l][n] for l in range(num_layers)) / r_sum
            var = sum(r[l] * (votes[l][n] - mu) ** 2 for l in range(num_layers)) / r_sum + var_floor
            cost = sum((math.log(math.sqrt(float(var[k]))) + (1 + math.log(2 * math.pi)) / 2) * r_sum
                       for k in range(h))
            act = 1 / (1 + math.exp(-lam * (float(beta_a[n]) - float(beta_mu[n]) * r_sum - cost)))
            mus.append(mu)
            sigmas2.append(var)
            acts.append(act)
        for l in range(num_layers):
            weighted = []
            for n in range(n_caps):
                p = 1.0
                for k in range(h):
                    p *= math.exp(-(float(votes[l][n][k] - mus[n][k]) ** 2) / (2 * float(sigmas2[n][k]))) \
                        / math.sqrt(2 * math.pi * float(sigmas2[n][k]))
                weighted.append(acts[n] * p)
            total = sum(weighted)
            c[l] = [w / total for w in weighted]
    omega = [acts[n] * mus[n] for n in range(n_caps)]
    return omega, history, acts

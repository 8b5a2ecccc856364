"""`governor bench spec`: its progress lines, summary table and figure (spec.png)."""
from __future__ import annotations

from governor.bench import report


def point_line(model: str, method: str, point: dict) -> str:
    line = (f"{model}  {method:<11} k={point['k']}  {point['tokens_per_second']:8.1f} tok/s  target "
            f"{1000 * point['target_forward_seconds_per_step']:.2f} ms/step (x{point['target_cost_growth']:.2f})")
    if point["k"] == 0:
        return line
    return line + (f"  speed-up {point['speedup']:.2f} vs predicted {_number(point['predicted_speedup'])}"
                   f"  a={_number(point['acceptance_rate'])} alpha={_number(point['alpha'])}"
                   f" c={_number(point['cost_ratio'], 3)}  per position "
                   + " ".join(f"{a:.2f}" for a in point["acceptance_per_position"]))


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def figure(results: list[dict]):
    from matplotlib.figure import Figure

    rows = [(result, drafter) for result in results for drafter in result["drafters"]]
    figure = Figure(figsize=(26, 4.4 * len(rows)), layout="constrained")
    axes = figure.subplots(len(rows), 5, squeeze=False)
    for (result, drafter), row in zip(rows, axes):
        _plot_throughput(row[0], result, drafter)
        _plot_speedup(row[1], drafter)
        _plot_acceptance(row[2], drafter)
        _plot_costs(row[3], drafter)
        _plot_concurrency(row[4], result, drafter)
    figure.suptitle("Speculative decoding: Governor engine beside Hugging Face transformers (same weights, greedy)")
    return figure


def _ks(drafter: dict) -> list[int]:
    return [point["k"] for point in drafter["sweep"]]


def _series(drafter: dict, key: str) -> list[float]:
    return [float("nan") if point[key] is None else point[key] for point in drafter["sweep"]]


def _plot_throughput(ax, result: dict, drafter: dict) -> None:
    ax.plot(_ks(drafter), _series(drafter, "tokens_per_second"), "o-", label="Governor")
    best = drafter["sweep"][drafter["best_k"]]
    ax.plot([best["k"]], [best["tokens_per_second"]], "*", markersize=16, color="C3", label=f"best k={best['k']}")
    ax.axhline(result["hf_generate_tokens_per_second"], color="gray", linestyle="--", label="HF generate")
    ax.axhline(drafter["peer"]["tokens_per_second"], color="C1", linestyle=":", label=drafter["peer"]["name"])
    ax.set(title=f"{result['model']} · {drafter['method']}: tokens/s at batch 1", xlabel="draft length k",
           ylabel="tokens/s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)


def _plot_speedup(ax, drafter: dict) -> None:
    ks = _ks(drafter)
    ax.plot(ks, _series(drafter, "speedup"), "o-", label="measured")
    ax.plot(ks, _series(drafter, "predicted_speedup"), "s--", label="Leviathan (flat target cost)")
    ax.plot(ks, _series(drafter, "predicted_speedup_measured_target_cost"), "^:",
            label="Leviathan with measured target cost")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set(title="speed-up over k=0", xlabel="draft length k", ylabel="x plain decoding")
    ax.legend(fontsize=8)


def _plot_acceptance(ax, drafter: dict) -> None:
    from matplotlib import colormaps

    colors = colormaps["viridis"]
    points = drafter["sweep"][1:]
    for point in points:
        per_position = point["acceptance_per_position"]
        ax.plot(range(1, len(per_position) + 1), per_position, "o-", markersize=3,
                color=colors(point["k"] / max(len(points), 1)), label=f"k={point['k']}")
    ax.set(title="acceptance per draft position", xlabel="position", ylabel="accepted through position", ylim=(0, 1.02))
    ax.legend(fontsize=7, ncol=2)


def _plot_costs(ax, drafter: dict) -> None:
    ks = _ks(drafter)
    ax.plot(ks, _series(drafter, "target_cost_growth"), "o-", label="target forward time per step ÷ k=0")
    ax.plot(ks, _series(drafter, "cost_ratio"), "s--", label="draft cost ratio c")
    ax.plot(ks, _series(drafter, "alpha"), "^:", label="acceptance alpha")
    ax.set(title="measured costs and acceptance", xlabel="draft length k", ylabel="ratio")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)


def _plot_concurrency(ax, result: dict, drafter: dict) -> None:
    n = result["concurrency"]
    labels = ["HF one by one", f"Governor ×{n}\nk=0", f"Governor ×{n}\nk={drafter['best_k']}"]
    values = [result["hf_one_by_one_tokens_per_second"], result["concurrent_plain_tokens_per_second"],
              drafter["concurrent_tokens_per_second"]]
    bars = ax.bar(labels, values, color=["gray", "C0", "C2"])
    ax.bar_label(bars, [f"{v:.0f} tok/s\n{v / values[0]:.1f}x" for v in values], fontsize=8)
    ax.set(title=f"{n} requests: at once vs one by one", ylabel="tokens/s")
    ax.margins(y=0.25)


def summary(data: dict) -> str:
    headers = ["model", "drafter", "best k", "tok/s k=0", "tok/s best", "speed-up", "predicted", "meas/pred",
               "HF gen", "HF peer", "vs peer", f"x{data['settings']['concurrency']} tok/s", "vs HF 1-by-1"]
    rows = [_summary_row(result, drafter) for result in data["models"] for drafter in result["drafters"]]
    verdicts = [f"  [{'met' if t['met'] else 'NOT met'}] {t['model']} {t['method']}: {t['target']}: "
                f"{_number(t['value'])}" for t in data["targets"]]
    return "\n".join([report.table(headers, rows), "targets:", *verdicts])


def _summary_row(result: dict, drafter: dict) -> list[str]:
    plain, best = drafter["sweep"][0], drafter["sweep"][drafter["best_k"]]
    concurrent = max(drafter["concurrent_tokens_per_second"], result["concurrent_plain_tokens_per_second"])
    return [result["model"], drafter["method"], str(drafter["best_k"]), f"{plain['tokens_per_second']:.1f}",
            f"{best['tokens_per_second']:.1f}", f"{best['speedup']:.2f}", _number(best["predicted_speedup"]),
            _number(drafter["speedup_over_predicted"]), f"{result['hf_generate_tokens_per_second']:.1f}",
            f"{drafter['peer']['tokens_per_second']:.1f}", f"{drafter['over_peer']:.2f}", f"{concurrent:.1f}",
            f"{drafter['concurrent_over_hf_one_by_one']:.2f}"]

"""Plan search: spaces, exact solvers and Pareto fronts over the cost model."""

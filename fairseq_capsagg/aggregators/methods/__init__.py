"""The methods: what each family computes, one ``nn.Module`` per file; the package's ``__init__`` imports them in
the order of ``--encoder-aggregation``'s choices (importing one registers it)."""

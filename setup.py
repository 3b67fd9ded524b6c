from setuptools import find_packages, setup

setup(
    name="fairseq-capsagg",
    version="0.1.0",
    description=(
        "Dynamic layer aggregation with routing-by-agreement for fairseq Transformers "
        "(Dou et al., AAAI 2019)"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["fairseq_capsagg", "fairseq_capsagg.*"]),
    python_requires=">=3.9",
    # fairseq itself (fairseq or fairseq-fixed==0.12.3.1) is installed separately with --no-deps: its metadata asks
    # for torchaudio, which would pull a second torch. The plugin needs only torch (any build: CPU or CUDA, never
    # replaced) and numpy; torch 2.5: torch.serialization.get_unsafe_globals_in_checkpoint (patches/
    # safe_checkpoints.py). The experiments (pipeline/, analysis/) need the extra: pip install -e .[experiments]
    install_requires=["torch>=2.5", "numpy"],
    extras_require={"experiments": ["sacrebleu>=2.0", "scipy", "sentencepiece", "subword-nmt", "matplotlib"]},
    entry_points={"console_scripts": [
        "capsagg-params=fairseq_capsagg.tools.param_count:cli_main",
        "capsagg-translate=fairseq_capsagg.tools.translate:cli_main",
        "capsagg-health=fairseq_capsagg.analysis.health:cli_main",
        "capsagg-main-job=fairseq_capsagg.pipeline.drivers.main_job:main",
        "capsagg-table1=fairseq_capsagg.pipeline.drivers.table1:main",
    ]},
    classifiers=["Programming Language :: Python :: 3", "Topic :: Scientific/Engineering :: Artificial Intelligence"],
)

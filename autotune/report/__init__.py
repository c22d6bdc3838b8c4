"""The morning review: plot data extracted from trials (pure), then HTML and PNG renderers.

`trials` reads Optuna trials into flat views, `arithmetic` holds SGLang's pool sizing for one
launch, `plotdata` turns views into small NamedTuples, `html` (plotly) and `png` (matplotlib)
draw them, and `page` writes the self-contained report. Tests assert on the plot data.
"""

# The Lab in a marimo notebook: `marimo edit notebooks/lab_marimo.py` (or `marimo run`). marimo renders anywidget,
# not ipywidgets' containers: a cell that ends with the Lab shows it as one anywidget (ortlab.widgets.mirror), whose
# JavaScript ships in ortlab (nothing fetched from a CDN). Every tab works as it does in JupyterLab.
import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full")


@app.cell
def _():
    import ortlab

    return (ortlab,)


@app.cell
def _(ortlab):
    lab = ortlab.Lab()  # the bundled demo; ortlab.Lab("my_model.py:make", {"kw": 1}) for your own model
    lab
    return (lab,)


if __name__ == "__main__":
    app.run()

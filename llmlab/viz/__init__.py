"""Pictures and tables for the notebooks: each function takes plain parameters and returns a
matplotlib figure, Graphviz source or an HTML object, so a widget only wires it up."""

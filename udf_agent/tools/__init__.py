"""Tools around the runtime: replay, plot, probe (check), doctor, TICKscript and line protocol."""
